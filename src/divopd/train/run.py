"""One training run: :func:`train` opens (or resumes) the run directory and runs the config's runtime
(:mod:`divopd.train.assemble` puts the run together).

The ``divopd train`` command is :mod:`divopd.commands.train`.

Runs asynchronous OPD: explorers play the student in the config's environment, the frozen teacher scores every
response token, the sampler composes one batch per update with the config's method, the learner takes one optimizer
step per batch. Writes a run directory (``config.yaml``, ``metrics.jsonl``, ``tb/``, ``experience/``,
``checkpoints/``, ``summary.json``). Ctrl-C checkpoints and exits; ``--resume`` continues from the newest checkpoint.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from divopd.train.config import TrainConfig
from divopd.train.interrupt import StopRequest

if TYPE_CHECKING:
    from divopd.train.trainer import Trainer


class Progress:
    """A rich progress bar: updates, latest SR, queue depth and the arrival/drain ratio. While it shows, log lines
    (the Ctrl-C warning among them) print on lines of their own above it."""

    def __init__(self, total: int, start: int, enabled: bool) -> None:
        self.enabled = enabled
        self.sr: float | None = None
        self._bar = None
        self._streams: list[tuple[logging.StreamHandler, Any]] = []
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
            self._task = self._bar.add_task("train", total=total, completed=start, info="")
            terminal = sys.stderr
            self._bar.start()  # sys.stderr now writes above the bar
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is terminal:
                    self._streams.append((handler, handler.setStream(sys.stderr)))

    def on_update(self, trainer: Any, metrics: dict[str, float]) -> None:
        sr = "-" if self.sr is None else f"{100 * self.sr:.0f}%"
        info = (f"SR {sr} | queue {trainer.sampler.waiting} | arrival/drain "
                f"{metrics['queue/arrival_drain_ratio']:.2f} | loss {metrics['learner/loss']:.3f}")
        if self._bar is not None:
            self._bar.update(self._task, completed=trainer.version, info=info)
        elif trainer.version % 10 == 0:
            logging.getLogger("divopd.train.run").info("update %d %s", trainer.version, info)

    def on_eval(self, update: int, results: dict[str, float]) -> None:
        self.sr = results.get("eval/success_rate")
        if self._bar is None:
            logging.getLogger("divopd.train.run").info("eval @%d: %s", update, json.dumps(results))

    def close(self) -> None:
        if self._bar is not None:
            for handler, stream in self._streams:
                handler.setStream(stream)
            self._bar.stop()


def train(cfg: TrainConfig | None = None, *, resume: str | Path | None = None, progress: bool = False,
          stop: StopRequest | None = None) -> dict:
    """Run (or resume) one training run; returns its summary (``summary["interrupted"]`` after a stop request).

    ``stop``: a :class:`~divopd.train.interrupt.StopRequest` whose signal handlers are installed (the CLI's); a stop
    requested while the models load or the explorers start is honoured once the loop starts: it checkpoints at
    once."""
    from divopd.errors import UsageError
    from divopd.train.assemble import open_run, run_trainer
    from divopd.train.preflight import check_before_run

    if cfg is not None:
        check_before_run(cfg)  # devices, models, engines, teacher server, env, disk: before the run directory is made
    trainer, resumed = open_run(cfg, resume=resume)  # it holds the run directory's lock until its files close
    bar = None
    try:
        if resume is not None:
            check_before_run(trainer.cfg, trainer.run_dir)
        bar = Progress(trainer.cfg.updates, trainer.version, progress)
        summary = run_trainer(trainer, bar, stop=stop)
    except UsageError:
        if resume is None and trainer.version == 0:
            discard_fresh_run(trainer)
        raise
    finally:
        if bar is not None:
            bar.close()
        if not trainer.closed:  # a failure the loop did not see (building the runtime, say)
            trainer.abort()
    summary["resumed"] = resumed
    summary["run_dir"] = str(trainer.run_dir)
    return summary


def discard_fresh_run(trainer: Trainer) -> None:
    """A fresh run that stopped on bad input (an unknown environment argument, say) before its first update leaves
    nothing behind: the files this invocation wrote are removed (never an entry the directory held before it,
    ``trainer.preexisting``), and the directory too if it is then empty and was made by this run, so the corrected
    command can be run again as it is instead of being refused with "already holds a run"."""
    from divopd.train.rundir import remove_run_files

    try:
        trainer.close()
    except Exception:  # noqa: BLE001 - closing is best effort here; the input error is what the user must see
        logging.getLogger(__name__).debug("closing the discarded run failed", exc_info=True)
    run_dir = Path(trainer.run_dir)
    before = trainer.preexisting
    remove_run_files(run_dir, keep=before or ())
    if before is None and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()
