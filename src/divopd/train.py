"""``divopd train CONFIG [--set key=value ...]`` and ``divopd train --resume RUN_DIR``.

Runs asynchronous OPD: explorers play the student in the config's environment, the frozen teacher scores every
response token, the sampler composes one batch per update with the config's method, the learner takes one optimizer
step per batch. Writes a run directory (``config.yaml``, ``metrics.jsonl``, ``tb/``, ``experience/``,
``checkpoints/``, ``summary.json``). Ctrl-C checkpoints and exits; ``--resume`` continues from the newest checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from divopd.config import TrainConfig, load_config
from divopd.interrupt import EXIT_INTERRUPTED, StopRequest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config (one per method row, see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set sampler.cap=6 (repeatable)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest checkpoint")
    parser.add_argument("--run-dir", help="write the run here instead of out_dir/<setting>/<method>/seed<seed>")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines instead)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


class Progress:
    """A rich progress bar: updates, latest SR, queue depth and the arrival/drain ratio."""

    def __init__(self, total: int, start: int, enabled: bool) -> None:
        self.enabled = enabled
        self.sr: float | None = None
        self._bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
            self._task = self._bar.add_task("train", total=total, completed=start, info="")
            self._bar.start()

    def on_update(self, trainer: Any, metrics: dict[str, float]) -> None:
        sr = "-" if self.sr is None else f"{100 * self.sr:.0f}%"
        info = (f"SR {sr} | queue {trainer.sampler.waiting} | arrival/drain "
                f"{metrics['queue/arrival_drain_ratio']:.2f} | loss {metrics['learner/loss']:.3f}")
        if self._bar is not None:
            self._bar.update(self._task, completed=trainer.version, info=info)
        elif trainer.version % 10 == 0:
            logging.getLogger("divopd.train").info("update %d %s", trainer.version, info)

    def on_eval(self, update: int, results: dict[str, float]) -> None:
        self.sr = results.get("eval/success_rate")
        if self._bar is None:
            logging.getLogger("divopd.train").info("eval @%d: %s", update, json.dumps(results))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def train(cfg: TrainConfig | None = None, *, resume: str | Path | None = None, progress: bool = False,
          stop: StopRequest | None = None) -> dict:
    """Run (or resume) one training run; returns its summary (``summary["interrupted"]`` after a stop request).

    ``stop``: a :class:`~divopd.interrupt.StopRequest` whose signal handlers are installed (the CLI's); a stop
    requested while the models load or the explorers start is honoured once the loop starts: it checkpoints at
    once."""
    from divopd.trainer import open_run

    trainer, resumed = open_run(cfg, resume=resume)
    cfg = trainer.cfg
    bar = Progress(cfg.updates, trainer.version, progress)
    try:
        if cfg.runtime.kind == "ray":
            from divopd.runtime.ray import run_ray

            summary = run_ray(trainer, bar, stop=stop)
        elif cfg.runtime.kind == "lockstep":
            from divopd.runtime.lockstep import run_lockstep

            summary = run_lockstep(trainer, bar, stop=stop)
        else:
            from divopd.runtime.threads import run_embedded

            summary = run_embedded(trainer, bar, stop=stop)
    finally:
        bar.close()
    summary["resumed"] = resumed
    summary["run_dir"] = str(trainer.run_dir)
    return summary


def quiet_hf_progress() -> None:
    """No per-file progress bars from transformers / huggingface_hub while training (the run has its own bar)."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def run(args: argparse.Namespace) -> int:
    quiet_hf_progress()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from divopd.errors import UsageError, check_model_folder

    if args.resume and args.config:
        raise UsageError("give a CONFIG or --resume RUN_DIR, not both")
    if not args.resume and not args.config:
        raise UsageError("a CONFIG file is required (or --resume RUN_DIR)")
    if args.resume and (args.overrides or args.run_dir):
        raise UsageError("--set and --run-dir do not apply to --resume RUN_DIR (the run keeps its config.yaml)")
    if args.config:
        extra = {"run_dir": args.run_dir} if args.run_dir else None
        cfg = load_config(args.config, args.overrides, data=extra)
    else:
        cfg = None
        saved = Path(args.resume, "config.yaml")
        if not Path(args.resume).exists():
            raise UsageError(f"--resume {args.resume}: no such run directory")
        if not Path(args.resume).is_dir():
            raise UsageError(f"--resume {args.resume}: not a run directory (a file)")
        if not saved.is_file():
            raise UsageError(f"--resume {args.resume}: not a divopd run directory (no config.yaml)")
        loaded = load_config(saved)  # the models below are checked against the run's own config
    if args.print_config:
        from divopd.config import dump_config

        print(dump_config(cfg) if cfg else saved.read_text())
        return 0
    for key in ("student", "teacher"):  # before anything heavy loads
        check_model_folder(getattr(cfg or loaded, key).path, f"{key}.path")
    with StopRequest() as stop:  # Ctrl-C / SIGTERM: stop at the next stage boundary, checkpoint, exit 130
        summary = train(cfg, resume=args.resume, progress=not args.no_progress and sys.stderr.isatty(), stop=stop)
    print(json.dumps(summary, indent=2, default=str))
    return EXIT_INTERRUPTED if summary.get("interrupted") else 0
