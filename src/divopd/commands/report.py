"""``divopd report RUN_DIR...``: the flags and the entry point; the report itself is :mod:`divopd.analysis.report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from divopd.analysis.report import ReportError, find_run_dirs, load_run, write_report

__all__ = ["add_arguments", "run"]


def _target(text: str) -> tuple[str | None, float]:
    setting, _, value = text.rpartition("=")
    try:
        tau = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"target must be PERCENT or SETTING=PERCENT, got {text!r}") from None
    if not 0.0 < tau <= 100.0:
        raise argparse.ArgumentTypeError(f"target must be in (0, 100] percent, got {tau}")
    return (setting or None), tau


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, or directories holding them")
    parser.add_argument("--out", default="report", help="output directory (default: ./report)")
    parser.add_argument("--target", type=_target, action="append", default=[], metavar="[SETTING=]TAU",
                        help="target SR in percent for all settings, or for one (repeatable); default: largest "
                        "multiple of 5 at or below the baseline's peak SR")
    parser.add_argument("--budget", type=int, default=None, metavar="U",
                        help="common learner-update budget for nAUC (default: the smallest last-eval update among a "
                        "setting's finished runs)")
    parser.add_argument("--baseline", default="vanilla", help="method the ratios compare against (default: vanilla)")
    parser.add_argument("--nauc-rule", choices=("trapezoid", "step"), default="trapezoid", help="nAUC integration rule")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    parser.add_argument("--group-anyway", action="store_true", help="pool runs of one method whose configs differ "
                        "in more than the seed as its seeds (a note in the report names the keys); default: refused")


def run(args: argparse.Namespace) -> int:
    targets = {setting: tau for setting, tau in args.target if setting is not None}  # the last one per setting wins
    target_all = next((tau for setting, tau in reversed(args.target) if setting is None), None)
    if args.budget is not None and args.budget < 0:
        raise ReportError(f"--budget must be >= 0, got {args.budget}")
    runs = [load_run(p) for p in find_run_dirs(args.run_dirs)]  # ReportError: one line, exit 2 (divopd.cli)
    rep = write_report(runs, args.out, plots=not args.no_plots, baseline=args.baseline, targets=targets,
                       target_all=target_all, budget=args.budget, rule=args.nauc_rule, group_anyway=args.group_anyway)
    n_settings = len(rep["settings"])
    print(f"divopd report: {len(runs)} run(s), {n_settings} setting(s) -> {Path(args.out) / 'report.md'}")
    for note in rep["notes"]:
        print(f"  note: {note}")
    return 0
