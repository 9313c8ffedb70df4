"""``divopd eval CHECKPOINT``: student-only evaluation of a checkpoint (or any HF model folder), by
:func:`divopd.train.evaluate.evaluate_checkpoint`; prints the ``eval/*`` metrics as JSON. The student samples at
``eval.temperature`` (0.4, seeded by the run seed); ``--set eval.greedy=true`` decodes greedily."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from divopd.train.evaluate import evaluate_checkpoint

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint folder, e.g. RUN/checkpoints/update-000100")
    parser.add_argument("--config", help="training config (default: the run's config.yaml beside the checkpoint)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--split", help="task split (default: explorer.eval_split)")
    parser.add_argument("--tasks", type=int, help="number of tasks (default: eval.tasks)")
    parser.add_argument("--json", help="also write the results to this JSON file")


def run(args: argparse.Namespace) -> int:
    results = evaluate_checkpoint(args.checkpoint, args.config, args.overrides, args.split, args.tasks)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0
