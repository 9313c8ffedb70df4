"""``divopd train CONFIG [--method ROW] [--set key=value ...]`` and ``divopd train --resume RUN_DIR``; CONFIG is a
packaged setting's name (:mod:`divopd.train.packaged`) or the path of a YAML config."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

from divopd.train.checkpoints import EXIT_CHECKPOINT_WRITE, CheckpointWriteError, disk_full_line, is_disk_full
from divopd.train.config import PLACEMENT_KEYS, load_config
from divopd.train.interrupt import EXIT_INTERRUPTED, StopRequest
from divopd.train.run import train
from divopd.train.watchdog import EXIT_STALLED

__all__ = ["add_arguments", "run"]

#: Keys ``--set`` may change on ``--resume``.
RESUME_KEYS = PLACEMENT_KEYS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="a packaged setting's name (tiny, coin6-dart, webshop, ...: "
                        "divopd/configs/<name>.yaml) or the path of a YAML config")
    parser.add_argument("--method", help="the method row to run (vanilla, divopd, divopd-r, ...; default: the config's "
                        "`method`); the same as --set method=ROW")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set sampler.cap=6 (repeatable)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest checkpoint")
    parser.add_argument("--run-dir", help="write the run here instead of out_dir/<setting>/<method>/seed<seed>")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines instead)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def check_model(config: str | None, path: str, key: str) -> None:
    """``key``'s model folder loads; when missing, the command that builds it (a packaged setting's demo models)."""
    from divopd.errors import UsageError, check_model_folder

    try:
        check_model_folder(path, key)
    except UsageError as exc:
        from divopd.suite.models import build_command

        command = build_command(config, path) if config and not Path(config).is_file() else None
        if command is None:
            raise
        raise UsageError(f"{exc}; build it with `{command}`") from None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from divopd.errors import UsageError

    if args.resume and args.config:
        raise UsageError("give a CONFIG or --resume RUN_DIR, not both")
    if not args.resume and not args.config:
        raise UsageError("a CONFIG (a packaged setting's name or a YAML file) is required (or --resume RUN_DIR)")
    for flag, given in (("--method", args.method), ("--run-dir", args.run_dir)):
        if args.resume and given:
            raise UsageError(f"{flag} does not apply to --resume RUN_DIR (the run keeps its config.yaml)")
    placement = [o for o in args.overrides if o.split("=", 1)[0].strip() not in RESUME_KEYS]
    if args.resume and placement:
        raise UsageError(f"--set {placement[0]} does not apply to --resume RUN_DIR (the run keeps its config.yaml; "
                         f"only where it runs may change: {', '.join(RESUME_KEYS)})")
    if args.config:
        extra = {"run_dir": args.run_dir} if args.run_dir else None
        method = [f"method={args.method}"] if args.method else []
        cfg = load_config(args.config, [*method, *args.overrides], data=extra)
        if not args.print_config and not Path(args.config).is_file():  # a packaged setting: its shipped models
            from divopd.suite.models import use_shipped_models

            use_shipped_models(str(args.config), cfg.student.path, cfg.teacher.path)
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
        from divopd.suite.runs import run_state

        if run_state(Path(args.resume)) == "done" and not args.print_config:
            print(f"divopd train: {args.resume} is finished ({loaded.updates} of {loaded.updates} updates); nothing "
                  f"to resume (its summary: {Path(args.resume, 'summary.json')})")
            return 0
        if args.overrides:  # placement only (checked above): resume the same run with another number of ranks
            cfg = load_config(saved, args.overrides)
    if args.print_config:
        from divopd.train.config import dump_config

        print(dump_config(cfg) if cfg else saved.read_text())
        return 0
    for key in ("student", "teacher"):  # before anything heavy loads
        check_model(args.config, getattr(cfg or loaded, key).path, f"{key}.path")
    from divopd.learn.ranks import LearnerRankError

    with StopRequest() as stop:  # Ctrl-C / SIGTERM: stop at the next stage boundary, checkpoint, exit 130
        try:
            summary = train(cfg, resume=args.resume, progress=not args.no_progress and sys.stderr.isatty(),
                            stop=stop)
        except LearnerRankError as exc:  # a dead learner rank: the run stopped, its newest checkpoint resumes it
            print(f"divopd train: error: {exc}; resume with `divopd train --resume RUN_DIR` (any "
                  "learner.world_size, via --set)", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # a second Ctrl-C quit at once: the newest checkpoint, if any, continues the run
            from divopd.train.rundir import has_checkpoint

            run_dir = Path(args.resume) if args.resume else cfg.resolved_run_dir()
            if getattr(args, "debug", False) or not has_checkpoint(run_dir):
                raise
            print(f"divopd train: interrupted; continue from the newest checkpoint with:\n"
                  f"divopd train --resume {shlex.quote(str(run_dir))}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except (CheckpointWriteError, OSError) as exc:  # disk full: one line, the newest good checkpoint intact
            if not isinstance(exc, CheckpointWriteError) and not is_disk_full(exc):
                raise
            print(f"divopd train: error: {disk_full_line(exc, args.resume or cfg.resolved_run_dir())}",
                  file=sys.stderr)
            return EXIT_CHECKPOINT_WRITE
    print(json.dumps(summary, indent=2, default=str))
    if summary.get("stalled"):  # the loop watchdog stopped the run (checkpointed): one line, exit 3
        print(f"divopd train: error: {summary['stalled']}; checkpointed at update {summary['updates']}: resume with "
              f"`divopd train --resume {summary['run_dir']}`", file=sys.stderr)
        return EXIT_STALLED
    if summary.get("interrupted"):
        print(f"divopd train: stopped at update {summary['updates']}, checkpointed; continue with:\n"
              f"divopd train --resume {shlex.quote(str(summary['run_dir']))}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
