"""``report.md`` and ``report.json`` of ``divopd report``: the tables per setting (results, batch composition, per
seed), the geometric-mean speedups and the notes, and :func:`write_report`, which writes them with the figures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from divopd.analysis.format import MISSING, dump_json, fmt, md_table
from divopd.analysis.report.compute import COMPOSITION_LABELS, DIAGNOSTICS, build_report
from divopd.analysis.report.load import Run
from divopd.analysis.report.plot import plot_setting

__all__ = ["render_markdown", "write_report"]

#: The cost ratios to τ, as keys of ``ratios`` and ``geometric_means``.
RATIOS = ("tokens", "compute")


def _pm(agg: dict[str, Any], digits: int = 1) -> str:
    if agg["mean"] is None:
        return MISSING
    std = agg["std"] if agg.get("std") is not None else agg.get("std_checkpoints")
    return fmt(agg["mean"], digits) + ("" if std is None else f" ± {fmt(std, digits)}")


def _pm_ci(agg: dict[str, Any], digits: int = 1) -> str:
    """``mean ± std [95% CI]`` (the CI only with ≥ 2 seeds)."""
    ci = agg.get("ci95")
    return _pm(agg, digits) + ("" if not ci else f" [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]")


def _ratio(x: float | None) -> str:
    if x is None:
        return MISSING
    return "∞" if math.isinf(x) else f"{x:.2f}×"


def _count(x: float | None, digits: int = 0) -> str:
    return MISSING if x is None else f"{x:,.{digits}f}"


def render_markdown(rep: dict[str, Any], pngs: dict[str, list[str]]) -> str:
    """report.md from the report dict."""
    base, rule = rep["baseline"], rep["nauc_rule"]
    lines = [
        "# DivOPD report", "",
        f"SR in percent. τ: target SR (default: largest multiple of 5 at or below {base}'s peak SR, mean over its "
        f"seeds). Ratios: {base}/method cost through the first eval reaching τ (mean over the seeds that reached it; "
        f"above 1 favours the method; – = not reached). nAUC: mean SR over [first eval, U] ({rule} rule). "
        "± : std across seeds when there are ≥ 2, else std across the final five checkpoints; [lo, hi]: 95% "
        "percentile-bootstrap CI of the mean over seeds (10,000 resamples, seeded).",
        "",
    ]
    for setting, s in rep["settings"].items():
        tau = "none" if s["target"] is None else f"{s['target']:g}%"
        lines += [f"## {setting}", "", f"τ = {tau} ({s['target_source']}); U = {fmt(s['budget'], 0)} learner updates."]
        lines += ["", *_results_table(s), "", *_paired_table(s), *_composition_table(s), "",
                  *_diagnostics_table(s), "", *_seed_table(s), ""]
        lines += [f"![{Path(p).stem}]({p})" for p in pngs.get(setting, [])]
        lines.append("")
    lines += _geomean_section(rep)
    if rep["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in rep["notes"]] + [""]
    return "\n".join(lines)


def _results_table(s: dict[str, Any]) -> list[str]:
    """Table 1's layout: peak SR, final-five SR, nAUC, seeds that reached τ and the cost ratios to τ."""
    rows = []
    for method, m in s["methods"].items():
        a = m["aggregate"]
        r = m["ratios"] or {}
        reached = a["reached_target"]
        rows.append([method, str(reached["of"]), _pm_ci(a["peak_sr"]), _pm_ci(a["final_five_mean"]), _pm_ci(a["nauc"]),
                     MISSING if s["target"] is None else f"{reached['n']}/{reached['of']}", _ratio(r.get("tokens")),
                     _ratio(r.get("compute"))])
    header = ["method", "seeds", "peak SR", "final-five SR", "nAUC", "reached τ", "tokens-to-τ ×", "compute-to-τ ×"]
    return md_table(header, rows)


def _paired_table(s: dict[str, Any]) -> list[str]:
    """The paired Wilcoxon signed-rank tests (per-seed nAUC; tokens-to-τ over the seeds where both reached τ)."""
    tests = s.get("paired_tests") or []
    if not tests:
        return []
    rows = []
    for t in tests:
        digits = 1 if t["metric"] == "nauc" else 0  # SR percent vs token counts
        rows.append([f"{t['method']} vs {t['against']}", t["question"], t["label"], str(len(t["seeds"])),
                     fmt(t["mean_method"], digits), fmt(t["mean_against"], digits), fmt(t["median_diff"], digits),
                     f"{t['w_plus']:g} / {t['w_minus']:g}",
                     MISSING if t["p_value"] is None else f"{t['p_value']:.3f}" + ("" if t["exact"] else " (normal)")])
    return ["Paired tests: Wilcoxon signed-rank over the seeds both methods ran (two-sided, exact; zero differences "
            "dropped). Means and the median difference are method − against over those seeds.", "",
            *md_table(["comparison", "isolates", "metric", "pairs", "mean (method)", "mean (against)", "median diff",
                       "W+ / W−", "p"], rows), ""]


def _composition_table(s: dict[str, Any]) -> list[str]:
    rows = []
    for method, m in s["methods"].items():
        c = m["aggregate"]["composition"]
        rows.append([method] + [
            _count(c.get(k)) if k == "expired" else fmt(c.get(k), 3 if k.endswith(("share", "fraction")) else 2)
            for k in COMPOSITION_LABELS
        ])
    return ["Batch composition (per-update means over the run, mean over seeds; expired: final ledger count).", "",
            *md_table(["method", *COMPOSITION_LABELS.values()], rows)]


def _diagnostics_table(s: dict[str, Any]) -> list[str]:
    """The diagnostics of the paper's tables (Tables 9, 12, 16, Figure 6), mean over seeds."""
    rows = []
    for method, m in s["methods"].items():
        d = m["aggregate"].get("diagnostics", {})
        rows.append([method, *(fmt(d.get(k), 3 if k in ("top1_token_share", "kl_per_token") else 2)
                               for k, *_ in DIAGNOSTICS)])
    header = ["method", *(f"{label} ({where.replace('Table ', 'T').replace('Figure ', 'F')})"
                          for _, _, _, label, where in DIAGNOSTICS)]
    return ["Diagnostics of the paper's tables (T = table, F = figure; per-update means over the run, teacher "
            "tok/trained tok and the disagreement-std EMA at the last update; mean over seeds). Tables 11 and 14 come "
            "from `divopd replay` on a shared buffer.", "", *md_table(header, rows)]


def _seed_table(s: dict[str, Any]) -> list[str]:
    rows = []
    for method, m in s["methods"].items():
        for sd in m["seeds"]:
            ff = sd["final_five_mean"]
            ff_s = MISSING if ff is None else f"{ff:.1f} ± {sd['final_five_std']:.1f} (n={sd['final_five_n']})"
            rows.append([method, str(sd["seed"]), "done" if sd["finished"] else "running", str(sd["n_evals"]),
                         fmt(sd["peak_sr"]), ff_s, fmt(sd["nauc"]), fmt(sd["update_to_target"], 0),
                         _count(sd["tokens_to_target"]), _count(sd["compute_s_to_target"], 1)])
    header = ["method", "seed", "state", "evals", "peak", "final-five", "nAUC", "update→τ", "tokens→τ", "compute s→τ"]
    return ["Per seed.", "", *md_table(header, rows)]


def _geomean_section(rep: dict[str, Any]) -> list[str]:
    lines = ["## Geometric-mean speedups across settings", ""]
    rows = [
        [method, *(f"{_ratio(g[k]['geomean'])} ({g[k]['n_settings']}/{g[k]['of']} settings)"
                   + (" from n = 1 seed: decides nothing" if g.get("min_seeds") == 1 else "") for k in RATIOS)]
        for method, g in rep["geometric_means"].items()
        if method != rep["baseline"]
    ]
    if rows:
        lines += md_table(["method", "tokens-to-τ ×", "compute-to-τ ×"], rows)
    else:
        lines.append("No method other than the baseline.")
    return [*lines, ""]


def write_report(runs: Sequence[Run], out: str | Path, *, plots: bool = True, **kwargs: Any) -> dict[str, Any]:
    """Build the report and write report.md, report.json and the PNGs into ``out``; returns the report dict."""
    rep = build_report(runs, **kwargs)  # a refusal leaves no folder behind
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, list[str]] = {}
    if plots:
        for setting, s in rep["settings"].items():
            by_method = {m: [r for r in runs if r.setting == setting and r.method == m] for m in s["methods"]}
            pngs[setting] = plot_setting(setting, by_method, s["target"], out)
    rep["plots"] = pngs
    dump_json(rep, out / "report.json", indent=2, nonfinite="str")  # strict JSON: inf becomes the string "inf"
    (out / "report.md").write_text(render_markdown(rep, pngs), encoding="utf-8")
    return rep
