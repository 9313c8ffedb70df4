"""The headline table of study/results/index.md: per study setting, the paper's four paired
contrasts on per-seed nAUC and the batch composition, read from the committed reports (study/results/regime/<setting>/
report.json). Prints one markdown table.

    .venv/bin/python study/regime/headline.py [--report study/results/regime] [--links ""]

Each contrast cell is ``method mean vs against mean`` over the seeds both ran and the exact two-sided Wilcoxon
signed-rank p on their per-seed nAUC (the report's ``paired_tests``); bold where p < 0.05 in the paper's direction,
"(reverse)" where p < 0.05 the other way, "equal" where every pair ties (without dead rows vanilla-pool is vanilla).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: (setting = the report folder and its setting, what it is, its results page under study/results/)
SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("coin4", "4 rooms; teacher 97%, student 23%", "demo.md"),
    ("coin4-ctx", "coin4 under a 370-token context (12% dead rows)", "demo.md"),
    ("coin4-ctx-batch", "coin4-ctx, one policy version per rollout", "demo.md"),
    ("coin4-dart", "4 rooms; DART-style teacher 90%, student 62%", "demo.md"),
    ("coin6", "6 rooms, 14 steps; teacher 75%, student 23%", "coin6.md"),
    ("coin6-batch", "coin6, one policy version per rollout", "coin6.md"),
    ("coin6-dart", "coin6's game; DART-style teacher 82%, student 28%", "coin6-dart.md"),
    ("coin6-dart-ctx", "coin6-dart under a 480-token context (22% dead rows)", "coin6-dart.md"),
    ("coin7-dart", "coin6-dart's models on 7 rooms, 20 steps", "coin7-dart.md"),
    ("coin6-dart-pool", "coin6-dart at c = 12, δ = 6 (the pool regime)", "pool-regime.md"),
    ("coin7-dart-pool", "coin7-dart at c = 16, δ = 8 (the pool regime)", "pool-regime.md"),
    ("coin6-dart-ctx-pool", "coin6-dart-ctx at c = 12, δ = 6", "pool-regime.md"),
)

#: (method, against) per column: DivOPD vs vanilla, the cap, focus, the validity gate
CONTRASTS: tuple[tuple[str, str], ...] = (
    ("divopd", "vanilla"), ("divopd-base", "nocap"), ("divopd", "divopd-base"), ("vanilla-pool", "vanilla"))
CONTROLLED = ("vanilla", "nocap", "divopd-base", "divopd")


def contrast(tests: list[dict[str, Any]], method: str, against: str) -> str:
    """One cell: the nAUC paired test of ``method`` against ``against`` (``–``: not run)."""
    test = next((t for t in tests if t["metric"] == "nauc" and (t["method"], t["against"]) == (method, against)),
                None)
    if test is None:
        return "–"
    if test["n"] == 0:
        return "equal"
    p, ahead = test["p_value"], test["mean_method"] > test["mean_against"]
    cell = f"{test['mean_method']:.1f} vs {test['mean_against']:.1f}, p = {p:{'.3f' if p < 0.1 else '.2f'}}"
    if p < 0.05:
        return f"**{cell}**" if ahead else f"{cell} (reverse)"
    return cell


def row(report: Path, setting: str, what: str, page: str) -> str:
    """The table row of one setting from its report.json."""
    data = json.loads((report / setting / "report.json").read_text())["settings"][setting]
    methods = data["methods"]
    seeds = min(len(methods[m]["seeds"]) for m in CONTROLLED)
    eff = [methods[m]["aggregate"]["composition"]["effective_rollouts"] for m in ("vanilla", "divopd")]
    cells = [contrast(data["paired_tests"], m, a) for m, a in CONTRASTS]
    return (f"| [{setting}]({page}) | {what} | {seeds} | " + " | ".join(cells)
            + f" | {eff[0]:.1f} / {eff[1]:.1f} |")


def table(report: Path, links: str) -> str:
    """The whole table, one row per :data:`SETTINGS` entry; page links prefixed with ``links``."""
    lines = ["| setting | what it is | seeds | DivOPD vs vanilla | the cap: divopd-base vs nocap "
             "| focus: divopd vs divopd-base | the gate: vanilla-pool vs vanilla "
             "| eff. rollouts per batch, vanilla / DivOPD |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [row(report, s, what, links + page) for s, what, page in SETTINGS]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, default=Path("study/results/regime"),
                    help="the folder of committed reports (default: study/results/regime)")
    ap.add_argument("--links", default="study/results/",
                    help="prefix of the results-page links (default: study/results/, from the repository root; "
                         "\"\" as in study/results/index.md)")
    args = ap.parse_args()
    try:
        print(table(args.report, args.links))
    except (OSError, KeyError, json.JSONDecodeError) as e:
        print(f"headline.py: cannot read a report under {args.report}: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
