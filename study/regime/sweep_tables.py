"""The load-sweep (the paper's Table 2) and cap-sweep (Table 19) tables of a plan's sweeps, from the folder that
`divopd bench paper --plan P --report` writes (``<out>/report``, or ``--report``): ``<setting>-load-<key><value>/`` per
load point, ``<setting>/`` for the main runs (their point of the sweep: the plan's config value) and
``<setting>-cap/``. Reads each group's report.json and coverage.json; prints two markdown tables.

    .venv/bin/python study/regime/sweep_tables.py study/regime/plan-coin6-dart.yaml

Load table: per point, vanilla / divopd-base side by side; unused valid rollouts is Table 11 on each run's own log
(coverage.json, mean over seeds); the last column compares the per-seed nAUC of the two rows (exact two-sided Wilcoxon
signed-rank over the seeds both ran). Cap table: per k, mean ± std over seeds; tokens-to-τ relative to the report's
baseline (its smallest k); the last column compares each k's per-seed nAUC with the paper's k = 4.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from divopd.analysis.report.stats import paired_values, wilcoxon_signed_rank
from divopd.suite.plan import PlanError, config_value, load_plan, plan_runs

ROWS = ("vanilla", "divopd-base")


def _group(report: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the group's report setting entry, its coverage.json or {})."""
    data = json.loads((report / name / "report.json").read_text())["settings"][name]
    cov = report / name / "coverage.json"
    return data, (json.loads(cov.read_text()) if cov.is_file() else {})


def _nauc(method: dict[str, Any]) -> dict[int, float | None]:
    return {s["seed"]: s["nauc"] for s in method["seeds"]}


def _compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """'x of n, p = ...': seeds where ``a``'s nAUC is above ``b``'s, over the seeds both ran."""
    seeds, x, y = paired_values(_nauc(a), _nauc(b))
    test = wilcoxon_signed_rank(x, y)
    p = "–" if test["p_value"] is None else f"{test['p_value']:.2f}"
    return f"{sum(u > v for u, v in zip(x, y, strict=True))} of {len(seeds)}, p = {p}"


def _pair(values: list[float | None], fmt: str) -> str:
    """Two rows' values side by side, ``a / b`` (``–``: none)."""
    return " / ".join("–" if v is None else format(v, fmt) for v in values)


def _pm(agg: dict[str, Any], name: str) -> str:
    """Mean ± std over seeds of one aggregate metric."""
    return f"{agg[name]['mean']:.1f} ± {agg[name]['std']:.1f}"


def _unused(cov: dict[str, Any], label: str) -> float | None:
    values = [c["own"]["unused_fraction"] for c in cov.get(label, []) if c is not None]
    return statistics.mean(values) if values else None


def load_table(report: Path, setting: str, key: str, main_value: Any) -> list[str]:
    """Table 2's rows, light load first; the main runs' point (``key`` = ``main_value``) is marked."""
    leaf = key.split(".")[-1]
    points: list[tuple[float, str, str]] = []
    for folder in report.glob(f"{setting}-load-{leaf}*"):
        value = folder.name.removeprefix(f"{setting}-load-{leaf}")
        if re.fullmatch(r"[0-9.]+", value) and (folder / "report.json").is_file():
            points.append((float(value), value, folder.name))
    points.append((float(main_value), f"{main_value} (main runs)", setting))
    head = [f"| {leaf} | producer load | arrival/drain | eff. rollouts | largest rollout share | expired stale | "
            "unused valid rollouts | final-five SR | nAUC | divopd-base ahead on nAUC |", "|" + "---|" * 10]
    lines = []
    for _, label, name in sorted(points):
        data, cov = _group(report, name)
        m = [data["methods"][r] for r in ROWS]
        comp = [x["aggregate"]["composition"] for x in m]
        agg = [x["aggregate"] for x in m]
        lines.append(
            f"| {label} | {comp[0]['producer_load']:.2f} | {_pair([c['arrival_drain_ratio'] for c in comp], '.2f')} | "
            f"{_pair([c['effective_rollouts'] for c in comp], '.2f')} | "
            f"{_pair([c['max_rollout_share'] for c in comp], '.2f')} | "
            f"{_pair([c['expired_fraction'] for c in comp], '.0%')} | "
            f"{_pair([_unused(cov, r) for r in ROWS], '.1%')} | "
            f"{_pair([a['final_five_mean']['mean'] for a in agg], '.1f')} | "
            f"{_pair([a['nauc']['mean'] for a in agg], '.1f')} | {_compare(m[1], m[0])} |")
    return head + lines


def cap_table(report: Path, setting: str, paper_k: int = 4) -> list[str]:
    """Table 19's rows, by k."""
    data, _ = _group(report, f"{setting}-cap")
    by_k = sorted((int(label.rsplit("-k", 1)[1]), label) for label in data["methods"])
    ref = next((data["methods"][label] for k, label in by_k if k == paper_k), None)
    tau = data["target"]
    head = [f"| k | seeds | peak SR | final-five SR | nAUC | reached τ = {tau:g} | tokens-to-τ × (vs k = {by_k[0][0]}) "
            f"| eff. rollouts | largest rollout share | nAUC above k = {paper_k} |", "|" + "---|" * 10]
    lines = []
    for k, label in by_k:
        m = data["methods"][label]
        a = m["aggregate"]
        tokens = m["ratios"]["tokens"]
        mark = " (the paper's)" if k == paper_k else ""
        lines.append(
            f"| {k}{mark} | {a['nauc']['n']} | {_pm(a, 'peak_sr')} | {_pm(a, 'final_five_mean')} | {_pm(a, 'nauc')} | "
            f"{a['reached_target']['n']}/{a['reached_target']['of']} | "
            f"{'–' if tokens is None else f'{tokens:.2f}×'} | {a['composition']['effective_rollouts']:.1f} | "
            f"{a['composition']['max_rollout_share']:.3f} | "
            f"{'–' if ref is None or k == paper_k else _compare(m, ref)} |")
    return head + lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path, help="the study's plan file (its sweeps: section)")
    ap.add_argument("--report", type=Path, default=None, help="the report folder (default: the plan's <out>/report)")
    args = ap.parse_args()
    try:
        plan = load_plan(args.plan)
        report = args.report or Path(plan.out) / "report"
        load, cap = plan.sweeps.load, plan.sweeps.cap
        tables = []
        if load is not None:  # the main runs' point: the value the plan's own main run of that row has
            main = next(r for r in plan_runs(plan)
                        if r.kind == "main" and r.setting == load.setting and r.label == load.methods[0])
            main_value = config_value(main.method, main.overrides, load.key, plan.config_file)
            tables.append(load_table(report, load.setting, load.key, main_value))
        if cap is not None:
            tables.append(cap_table(report, cap.setting))
    except (PlanError, OSError, KeyError) as exc:  # a bad plan, or a report not written yet: one line, exit 2
        print(f"sweep_tables: {exc.__class__.__name__}: {exc} (run `divopd bench paper --plan P --report` first?)",
              file=sys.stderr)
        sys.exit(2)
    print("\n\n".join("\n".join(t) for t in tables))


if __name__ == "__main__":
    main()
