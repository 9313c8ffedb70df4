"""``divopd doctor [CONFIG|SETTING] [--set ...] [--json]``: what this machine offers (:mod:`divopd.train.probes`) and,
given a config (as ``divopd train`` takes it), what it needs: the checks ``divopd train`` runs before it makes a run
directory (:mod:`divopd.train.preflight`). Exit 0 when the config can run here, 2 with one line per blocker."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from divopd.train.probes import Check

if TYPE_CHECKING:
    from divopd.train.config import TrainConfig

__all__ = ["add_arguments", "format_table", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="a packaged setting's name (tiny, coin6-dart, webshop, ...) or the "
                        "path of a YAML config; without one, only the machine's rows")
    parser.add_argument("--method", help="the method row (as divopd train --method)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set student.device=cuda (repeatable)")
    parser.add_argument("--run-dir", help="the run directory whose filesystem's free space is checked (default: the "
                        "config's)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines (one object per row)")
    parser.add_argument("--import-timeout", type=float, default=60.0, metavar="S",
                        help="deadline of vLLM's import probe, in a subprocess (default 60 s; 0 = do not import)")


def format_table(title: str, rows: list[Check]) -> str:
    """``rows`` as an aligned text table under ``title``; a row's fix follows its detail after ``->``."""
    width = max([len(r.name) for r in rows] + [5])
    lines = [title, f"  {'check':<{width}}  {'status':<13}  detail"]
    for r in rows:
        fix = f"  ->  {r.fix}" if r.fix and r.status not in ("ok", "not needed") and r.fix not in r.detail else ""
        lines.append(f"  {r.name:<{width}}  {r.status:<13}  {r.detail}{fix}")
    return "\n".join(lines)


def _built_by_command(config: str, cfg: TrainConfig, row: Check) -> Check:
    """A missing model folder that a command builds (a packaged setting's demo models): the row names the command."""
    from divopd.suite.models import build_command

    command = None if Path(config).is_file() else build_command(config, cfg.get(row.name))
    if command is None:
        return row
    return Check(row.name, row.status, row.detail, f"build it: `{command}` (then trains the demo's runs)",
                 f"{row.blocker}; build it with `{command}`", row.error)


def run(args: argparse.Namespace) -> int:
    from divopd.errors import UsageError
    from divopd.train.probes import machine_checks

    if args.import_timeout < 0:
        raise UsageError(f"--import-timeout: expected seconds >= 0, got {args.import_timeout:g}")
    if (args.method or args.overrides or args.run_dir) and not args.config:
        raise UsageError("--method, --set and --run-dir need a CONFIG (a packaged setting's name or a YAML file)")
    cfg, shipped = None, {}
    if args.config:
        from divopd.train.config import load_config

        extra = {"run_dir": args.run_dir} if args.run_dir else None
        method = [f"method={args.method}"] if args.method else []
        cfg = load_config(args.config, [*method, *args.overrides], data=extra)
        if not Path(args.config).is_file():  # a packaged setting: the prebuilt models its first divopd train copies
            from divopd.suite.models import shipped_models_for

            shipped = shipped_models_for(args.config, cfg.student.path, cfg.teacher.path)
        if shipped:  # check those in place of the folders not there yet
            sets = [f"{name}.path={folder}" for name, folder in shipped.items()]
            cfg = load_config(args.config, [*method, *args.overrides, *sets], data=extra)
    machine = machine_checks(args.import_timeout)
    config_rows: list[Check] = []
    if cfg is not None:
        from divopd.train.preflight import config_checks

        machine = [r for r in machine if r.name != "disk"]  # the config's disk row is the run directory's
        config_rows = config_checks(cfg, doctor=True)
        for i, r in enumerate(config_rows):
            name = r.name.removesuffix(".path")
            if r.name.endswith(".path") and name in shipped and r.status == "ok":
                config_rows[i] = Check(r.name, r.status, f"{r.detail}: the package's prebuilt {name}, copied to "
                                       f"cache/{args.config}/{name} on the first divopd train")
            elif r.name in ("student.path", "teacher.path") and r.blocker:
                config_rows[i] = _built_by_command(args.config, cfg, r)
    stops = [r for r in config_rows if r.blocker]
    if args.json:
        for section, rows in (("machine", machine), ("config", config_rows)):
            for r in rows:
                print(json.dumps({"section": section, **r.as_dict()}))
    else:
        print(format_table("this machine:", machine))
        if cfg is not None:
            print()
            print(format_table(f"config {args.config} (run directory {cfg.resolved_run_dir()}):", config_rows))
            print()
            print("this config can run here" if not stops else
                  f"{len(stops)} blocker(s): this config cannot run here as it is")
    sys.stdout.flush()
    for r in stops:
        print(f"divopd doctor: error: {r.blocker}", file=sys.stderr)
    return 2 if stops else 0
