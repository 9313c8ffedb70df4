"""Pair the runs of two study groups seed by seed, from their ``report.json`` files: per method, the mean peak SR,
final-five SR and nAUC of each group over the seeds both ran, and a Wilcoxon signed-rank test of the per-seed nAUC.
Prints a markdown table. Use it for a variant that changes one thing (an estimator, a budget) on the seeds of a
study whose runs are no longer on disk, e.g. the sampled-token estimator against the study's top-k runs:

    .venv/bin/python study/regime/pair_reports.py \\
        study/results/regime/coin6-dart-sampled/report.json coin6-dart-sampled \\
        study/results/regime/coin6-dart/report.json coin6-dart

``--against METHOD`` pairs every method of the first group with METHOD of the second instead (give the same report and
group twice to test each row of one study against its vanilla).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from divopd.analysis.report.stats import wilcoxon_signed_rank

METRICS = ("peak_sr", "final_five_mean", "nauc")


def finished_seeds(report: dict[str, Any], group: str) -> dict[str, dict[int, dict[str, float]]]:
    """``{method: {seed: {metric: value}}}`` for the finished runs of ``group`` in a report.json."""
    settings = report.get("settings", {})
    if group not in settings:
        raise KeyError(f"no group {group!r} in the report (it has: {', '.join(settings) or 'none'})")
    out: dict[str, dict[int, dict[str, float]]] = {}
    for method, entry in settings[group]["methods"].items():
        for run in entry["seeds"]:
            if run.get("finished") and all(run.get(m) is not None for m in METRICS):
                out.setdefault(method, {})[int(run["seed"])] = {m: float(run[m]) for m in METRICS}
    return out


def pair_rows(a: dict[str, dict[int, dict[str, float]]], b: dict[str, dict[int, dict[str, float]]],
              against: str | None = None) -> list[dict[str, Any]]:
    """One row per method both groups ran (or, with ``against``, per method of ``a`` other than it, paired with
    ``b[against]``): seeds in common, each group's means, the nAUC test (a − b)."""
    rows = []
    for method in a:
        if method == against:
            continue
        ref = b.get(method if against is None else against, {})
        seeds = sorted(set(a[method]) & set(ref))
        if not seeds:
            continue
        row: dict[str, Any] = {"method": method, "seeds": seeds}
        for metric in METRICS:
            row[metric] = (statistics.fmean(a[method][s][metric] for s in seeds),
                           statistics.fmean(ref[s][metric] for s in seeds))
        test = wilcoxon_signed_rank([a[method][s]["nauc"] for s in seeds], [ref[s]["nauc"] for s in seeds])
        row["ahead"] = sum(a[method][s]["nauc"] > ref[s]["nauc"] for s in seeds)
        row["p"] = test["p_value"]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report_a", type=Path, help="the variant's report.json")
    ap.add_argument("group_a", help="its study group")
    ap.add_argument("report_b", type=Path, help="the reference report.json")
    ap.add_argument("group_b", help="its study group")
    ap.add_argument("--against", metavar="METHOD", help="pair every method of the first group with this one")
    args = ap.parse_args()
    try:
        a = finished_seeds(json.loads(args.report_a.read_text()), args.group_a)
        b = finished_seeds(json.loads(args.report_b.read_text()), args.group_b)
    except (OSError, ValueError, KeyError) as exc:
        print(f"pair_reports: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.against is not None and args.against not in b:
        print(f"pair_reports: --against {args.against!r}: no finished run of it in {args.group_b}", file=sys.stderr)
        raise SystemExit(2)
    name_a, name_b = args.group_a, args.group_b if args.against is None else args.against
    print(f"| method | seeds | peak SR {name_a} / {name_b} | final-five {name_a} / {name_b} | "
          f"nAUC {name_a} / {name_b} | {name_a} ahead (nAUC) | p (Wilcoxon, nAUC) |")
    print("|---|---|---|---|---|---|---|")
    for row in pair_rows(a, b, args.against):
        cells = [f"{row[m][0]:.1f} / {row[m][1]:.1f}" for m in METRICS]
        p = "–" if row["p"] is None else f"{row['p']:.3f}"
        print(f"| {row['method']} | {len(row['seeds'])} | " + " | ".join(cells)
              + f" | {row['ahead']} of {len(row['seeds'])} | {p} |")


if __name__ == "__main__":
    main()
