"""``divopd bench paper``: run the paper benchmark suite of :mod:`divopd.suite` (resumable; ``--dry-run``,
``--only``, ``--report``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from divopd.suite.plan import DEFAULT_PLAN, load_plan, plan_runs, select_runs
from divopd.suite.report import write_reports
from divopd.suite.runs import dry_run_text, train_runs

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", choices=("paper",),
                        help="benchmark suite (paper: the plan of the paper's tables, or a plan of your own with "
                        "--plan)")
    parser.add_argument("--plan", default=str(DEFAULT_PLAN),
                        help="plan file (default: the paper's plan, shipped with divopd: divopd/suite/paper_plan.yaml)")
    parser.add_argument("--out", default=None, help="runs folder (default: the plan's out, runs/paper)")
    parser.add_argument("--only", action="append", default=[], metavar="GROUP[/LABEL]",
                        help="only these runs (shell globs, repeatable), e.g. coin2/divopd or '*-cap'; with --only or "
                             "--seeds the reports are left as they are (--report rewrites them)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, metavar="SEED",
                        help="only the runs of these seeds (with --only: both must match), e.g. --seeds 0 1 2")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their state; train nothing")
    parser.add_argument("--report", action="store_true", help="only write the reports from the runs that exist")


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)  # PlanError: one line, exit 2 (divopd.cli)
    out = Path(args.out or plan.out)
    runs = select_runs(plan_runs(plan), args.only, args.seeds)
    if args.dry_run:
        print(dry_run_text(runs, out))
        return 0
    if not args.report:
        import torch

        from divopd.suite.models import SHIPPED, prepare_models, recipe_for

        torch.set_num_threads(1)
        if plan.own_config:  # a config of the user's own: its models as they are
            from divopd.train.config import load_config

            cfg = load_config(plan.config_file)
            models = {"student": Path(cfg.student.path), "teacher": Path(cfg.teacher.path)}
        else:
            models = prepare_models(Path(plan.cache), recipe_for(plan.configs), shipped=SHIPPED / plan.configs)
        train_runs(runs, plan, out, models)
        if args.only or args.seeds:  # a piece of the plan: its report would hide every other run of it
            again = f"divopd bench paper --plan {args.plan}" + (f" --out {args.out}" if args.out else "")
            print(f"divopd bench: {len(runs)} selected runs done; reports not rewritten (`{again} --report` writes "
                  "them over every run that exists)")
            return 0
    index = write_reports(runs, plan, out)
    print(index.read_text())
    print(f"divopd bench: reports in {index.parent}")
    return 0
