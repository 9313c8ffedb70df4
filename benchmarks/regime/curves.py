"""Mean held-out SR at every evaluation, over the seeds of each method of one study group (the learning curves of
docs/results/demo.md as numbers). Only runs that reached the last evaluation count. Prints a markdown table.

    .venv/bin/python benchmarks/regime/curves.py runs/regime/coin4
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from divopd.analysis.report.load import load_run


def curve(run_dir: Path) -> dict[int, float]:
    """Held-out SR (percent) per evaluated update of one run, read as ``divopd report`` reads it."""
    return {e.update: e.sr for e in load_run(run_dir).evals}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("group", type=Path, help="a study group folder: <method>/seed<N>/metrics.jsonl inside")
    args = ap.parse_args()
    table: dict[str, list[dict[int, float]]] = {}
    for metrics in sorted(args.group.glob("*/seed*/metrics.jsonl")):
        table.setdefault(metrics.parent.parent.name, []).append(curve(metrics.parent))
    last = max((max(c) for cs in table.values() for c in cs if c), default=0)
    updates = sorted({u for cs in table.values() for c in cs for u in c if u <= last})
    print("| method | seeds | " + " | ".join(f"@{u}" for u in updates) + " |")
    print("|---|---|" + "---|" * len(updates))
    for method, curves in table.items():
        done = [c for c in curves if last in c]
        if not done:
            continue
        cells = [f"{statistics.fmean(c[u] for c in done if u in c):.1f}" for u in updates]
        print(f"| {method} | {len(done)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
