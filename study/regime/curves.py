"""Mean held-out SR at every evaluation, over the seeds of each method of one study group (the learning curves of
study/results/demo.md as numbers). Only runs that reached the last evaluation count. Prints a markdown table.

    .venv/bin/python study/regime/curves.py runs/regime/coin4
    .venv/bin/python study/regime/curves.py runs/regime-coin7-dart-pool/coin7-dart-pool --dip 10
    .venv/bin/python study/regime/curves.py study/results/regime/coin7-dart-pool-cap/report.json --dip 10

The group is a run folder or a committed ``report.json`` (its per-seed ``sr_curve``; ``--setting`` picks the setting
when it has several). Reports written before 2026-12-05 have no ``sr_curve``: re-run ``--report`` on the runs.

``--dip U`` prints the early dip instead: per method, the mean over seeds of the first held-out SR, of the lowest SR
evaluated in updates 1..U, of the drop between them (:func:`early_dip`), and the seeds whose drop is 10 points or more
(how many, and which).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from divopd.analysis.report.load import load_run


def curve(run_dir: Path) -> dict[int, float]:
    """Held-out SR (percent) per evaluated update of one run, read as ``divopd report`` reads it."""
    return {e.update: e.sr for e in load_run(run_dir).evals}


def early_dip(sr: dict[int, float], within: int) -> tuple[float, float]:
    """(lowest held-out SR evaluated in updates 1..within, the first SR minus it). A run that only rises has a drop
    of at most 0; a run with no evaluation in 1..within has (first SR, 0)."""
    first = sr[min(sr)]
    low = min((v for u, v in sr.items() if 1 <= u <= within), default=first)
    return low, first - low


def report_curves(report: Path, setting: str | None,
                  seeds: set[int] | None = None) -> dict[str, dict[int, dict[int, float]]]:
    """Per method and seed, the curves (update -> SR) stored in a ``report.json`` (``sr_curve``) for one setting
    (``None``: the report's only one). Raises ``ValueError`` naming what is missing."""
    settings = json.loads(report.read_text())["settings"]
    if setting is None:
        if len(settings) != 1:
            raise ValueError(f"{report} has {len(settings)} settings; pick one with --setting: {', '.join(settings)}")
        setting = next(iter(settings))
    if setting not in settings:
        raise ValueError(f"{report} has no setting {setting!r}; it has: {', '.join(settings)}")
    table: dict[str, dict[int, dict[int, float]]] = {}
    for method, entry in settings[setting]["methods"].items():
        for s in entry["seeds"]:
            if "sr_curve" not in s:
                raise ValueError(f"{report} has no sr_curve (written before 2026-12-05): re-run --report on its runs")
            if seeds is None or s["seed"] in seeds:
                table.setdefault(method, {})[s["seed"]] = {int(u): float(v) for u, v in s["sr_curve"]}
    return table


def collapses(curves: dict[int, dict[int, float]], within: int) -> str:
    """``"x of n (seeds a, b)"``: how many of the seeds' curves drop 10 points or more within updates 1..within."""
    fell = [str(seed) for seed, c in sorted(curves.items()) if early_dip(c, within)[1] >= 10]
    which = f" (seed{'s' if len(fell) > 1 else ''} {', '.join(fell)})" if fell else ""
    return f"{len(fell)} of {len(curves)}{which}"


def print_dips(table: dict[str, dict[int, dict[int, float]]], within: int, last: int) -> None:
    """The ``--dip`` table over the runs that reached the last evaluation."""
    print(f"| method | seeds | first SR | lowest SR in updates 1-{within} | drop | seeds dropping >= 10 points |")
    print("|---|---|---|---|---|---|")
    for method, curves in table.items():
        done = {seed: c for seed, c in curves.items() if last in c}
        if not done:
            continue
        dips = [early_dip(c, within) for c in done.values()]
        print(f"| {method} | {len(done)} | {statistics.fmean(c[min(c)] for c in done.values()):.1f} "
              f"| {statistics.fmean(d[0] for d in dips):.1f} | {statistics.fmean(d[1] for d in dips):.1f} "
              f"| {collapses(done, within)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("group", type=Path, help="a study group folder (<method>/seed<N>/metrics.jsonl inside) or a "
                    "report.json")
    ap.add_argument("--setting", help="with a report.json: the setting (default: its only one)")
    ap.add_argument("--seeds", type=lambda v: {int(x) for x in v.split(",")}, metavar="0,1,..",
                    help="only these seeds (to pair groups that ran different seeds)")
    ap.add_argument("--dip", type=int, metavar="U", help="print the early dip within updates 1..U instead")
    args = ap.parse_args()
    if args.dip is not None and args.dip < 1:
        ap.error(f"--dip must be at least 1, got {args.dip}")
    table: dict[str, dict[int, dict[int, float]]] = {}
    if args.group.is_file():
        try:
            table = report_curves(args.group, args.setting, args.seeds)
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            print(f"curves.py: {e}", file=sys.stderr)
            sys.exit(2)
    else:
        for metrics in sorted(args.group.glob("*/seed*/metrics.jsonl")):
            seed = int(metrics.parent.name.removeprefix("seed"))
            if args.seeds is None or seed in args.seeds:
                table.setdefault(metrics.parent.parent.name, {})[seed] = curve(metrics.parent)
    last = max((max(c) for cs in table.values() for c in cs.values() if c), default=0)
    if args.dip is not None:
        print_dips(table, args.dip, last)
        return
    updates = sorted({u for cs in table.values() for c in cs.values() for u in c if u <= last})
    print("| method | seeds | " + " | ".join(f"@{u}" for u in updates) + " |")
    print("|---|---|" + "---|" * len(updates))
    for method, curves in table.items():
        done = [c for c in curves.values() if last in c]
        if not done:
            continue
        cells = [f"{statistics.fmean(c[u] for c in done if u in c):.1f}" for u in updates]
        print(f"| {method} | {len(done)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
