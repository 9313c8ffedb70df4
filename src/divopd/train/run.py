"""One training run (:func:`train`, behind ``divopd train``): preflight, the run directory, the config's runtime."""

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
    """A rich progress bar of updates, latest SR, queue depth and arrival/drain; log lines print above it."""

    def __init__(self, total: int, start: int, enabled: bool) -> None:
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
    """Run (or resume) one training run; returns its summary. ``stop``: the CLI's installed
    :class:`~divopd.train.interrupt.StopRequest` (a stop during start-up is honoured once the loop starts)."""
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
    """Remove what a fresh run that stopped on bad input before its first update wrote (never an entry the directory
    held before), and the directory if this run made it, so the corrected command runs again as it is."""
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
