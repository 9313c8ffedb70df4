"""``divopd report RUN_DIR...``: compare runs of several methods per setting, in the layout of the paper's Section 4.

For each setting (``config.yaml: setting``) and method (``config.yaml: method``), seeds (``config.yaml: seed``) are
aggregated. Written to ``--out`` (default ``./report``):

- ``report.md``: Table 1-like table per setting (peak SR, final-five SR, nAUC over a common update budget U, learner
  tokens and learner compute seconds to the target τ as baseline/method ratios, a dash when not reached), geometric-mean
  speedups across settings, a batch-composition table (effective rollouts, max rollout share, dead rows, expired turns,
  staleness, disagreement std across rollouts — Figure 6 — and the arrival/drain ratio of Table 2), and per-seed rows.
- ``report.json``: the same numbers, machine-readable.
- PNGs per setting: SR vs learner updates, vs learner tokens, vs learner compute seconds (mean over seeds, band =
  min–max over seeds), and batch-composition curves.

Rules (see docs/sections/report.md): SR in percent; τ defaults to the largest multiple of 5 at or below the baseline's
peak SR (mean of its seeds' peaks); U defaults to the smallest last-eval update among the setting's runs; a cost to τ is
the mean over the seeds that reached τ, and the ratio is baseline mean / method mean; ± is the std across seeds
(sample, ddof=1) when there are two or more seeds, else the std across the final five checkpoints as in the paper.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from divopd.errors import UsageError, describe_yaml_error
from divopd.experience.metrics import (
    EvalPoint,
    cost_to_target,
    default_target,
    final_five,
    geometric_mean,
    nauc,
    peak_sr,
    speedup,
)
from divopd.sampling.rows import method_names

__all__ = ["ReportError", "Run", "add_arguments", "build_report", "find_run_dirs", "load_run", "run", "write_report"]

#: Paper's method rows, in table order; other methods follow alphabetically.
#: The method rows in display order (the registry's, :data:`divopd.sampling.ROWS`, when this module was imported).
METHOD_ORDER = method_names()

#: Batch-composition columns: (report key, metrics.jsonl key, how the run's per-update values are summarised).
COMPOSITION = (
    ("effective_rollouts", "sampler/effective_rollouts", "mean"),
    ("max_rollout_share", "sampler/max_rollout_share", "mean"),
    ("dead_rows", "sampler/dead_rows", "mean"),
    ("mean_staleness", "sampler/mean_staleness", "mean"),
    ("disagreement_std_across_rollouts", "sampler/disagreement_std_across_rollouts", "mean"),
    ("arrival_drain_ratio", "queue/arrival_drain_ratio", "mean"),
    ("expired", "ledger/expired", "last"),
    ("received", "ledger/received", "last"),
)
COMPOSITION_LABELS = {
    "effective_rollouts": "eff. rollouts",
    "max_rollout_share": "max share",
    "dead_rows": "dead rows",
    "mean_staleness": "staleness",
    "disagreement_std_across_rollouts": "disagr. std",
    "arrival_drain_ratio": "arrival/drain",
    "expired": "expired",
    "expired_fraction": "expired/recv.",
}


class ReportError(UsageError):
    """A run directory or metrics file that cannot be read; the message names the file (and line)."""


@dataclass
class Run:
    """One run directory: identity from config.yaml, eval points (SR in percent) and update records."""

    path: Path
    method: str
    setting: str
    seed: Any
    evals: list[EvalPoint] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def last_update(self) -> int | None:
        """Highest learner version seen in any record."""
        us = [e.update for e in self.evals] + [r["update"] for r in self.updates]
        return max(us) if us else None


# --------------------------------------------------------------------------------------------------- loading


def find_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories named on the command line: a dir holding ``config.yaml``, or every such dir below it."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"{p}: not a directory")
        if (p / "config.yaml").is_file():
            found.append(p)
            continue
        below = sorted(c.parent for c in p.rglob("config.yaml") if "checkpoints" not in c.relative_to(p).parts)
        if not below:
            raise ReportError(f"{p}: no config.yaml in it or below it (not a run directory)")
        found.extend(below)
    seen: set[Path] = set()
    unique = []
    for p in found:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def _load_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.yaml"
    try:
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{cfg_path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ReportError(f"{cfg_path}: malformed YAML: {describe_yaml_error(exc)}") from exc
    if not isinstance(cfg, dict):
        raise ReportError(f"{cfg_path}: expected a mapping at top level, got {type(cfg).__name__}")
    for key in ("method", "setting", "seed"):
        if cfg.get(key) is None:
            raise ReportError(f"{cfg_path}: missing top-level key {key!r} (needed to group runs)")
    return cfg


def _number(rec: dict[str, Any], key: str, where: str) -> float | None:
    value = rec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Records of a ``metrics.jsonl`` and notes. A malformed line raises :class:`ReportError` naming file and line,
    except a cut-off final line without newline (a write in progress), which is skipped with a note."""
    notes: list[str] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    lines = text.split("\n")
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):  # last line, no newline after it: being written right now
                notes.append(f"{where}: skipped a cut-off final line (run in progress?)")
                continue
            raise ReportError(f"{where}: malformed JSON line: {exc.msg} at column {exc.colno}") from exc
        if not isinstance(rec, dict):
            raise ReportError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        kind = rec.get("kind")
        if kind not in ("update", "eval"):
            raise ReportError(f"{where}: 'kind' must be 'update' or 'eval', got {kind!r}")
        update = rec.get("update")
        if isinstance(update, bool) or not isinstance(update, int) or update < 0:
            raise ReportError(f"{where}: 'update' must be a non-negative integer, got {update!r}")
        if kind == "eval":
            sr = _number(rec, "eval/success_rate", where)
            if sr is None:
                raise ReportError(f"{where}: eval record without 'eval/success_rate'")
            if not 0.0 <= sr <= 1.0:
                raise ReportError(f"{where}: 'eval/success_rate' must be in [0, 1], got {sr}")
        for key in ("learner/tokens_total", "learner/compute_s_total"):
            _number(rec, key, where)
        rec["_line"] = lineno
        records.append(rec)
    return records, notes


def load_run(path: str | Path) -> Run:
    """Load one run directory (config.yaml + metrics.jsonl); SR converted to percent, evals sorted by update."""
    path = Path(path)
    cfg = _load_config(path)
    run_ = Run(path=path, method=str(cfg["method"]), setting=str(cfg["setting"]), seed=cfg["seed"])
    run_.finished = (path / "summary.json").is_file()
    mpath = path / "metrics.jsonl"
    if not mpath.is_file():
        run_.notes.append(f"{path}: no metrics.jsonl yet")
        return run_
    records, notes = read_metrics(mpath)
    run_.notes.extend(notes)
    run_.updates = sorted((r for r in records if r["kind"] == "update"), key=lambda r: r["update"])
    # Cumulative resources at an eval: from the eval record, else from the latest update record at or before it.
    cum: dict[str, list[tuple[int, float]]] = {"learner/tokens_total": [], "learner/compute_s_total": []}
    for r in run_.updates:
        for key, series in cum.items():
            if r.get(key) is not None:
                series.append((r["update"], float(r[key])))

    def at(key: str, update: int) -> float | None:
        best = None
        for u, v in cum[key]:
            if u <= update:
                best = v
        return best

    by_update: dict[int, EvalPoint] = {}
    for r in (r for r in records if r["kind"] == "eval"):
        u = r["update"]
        if u in by_update:
            run_.notes.append(f"{mpath}:{r['_line']}: second eval at update {u}; the later line is used")
        tokens = r.get("learner/tokens_total")
        compute = r.get("learner/compute_s_total")
        by_update[u] = EvalPoint(
            update=u,
            sr=100.0 * float(r["eval/success_rate"]),
            tokens=float(tokens) if tokens is not None else at("learner/tokens_total", u),
            compute_s=float(compute) if compute is not None else at("learner/compute_s_total", u),
        )
    run_.evals = [by_update[u] for u in sorted(by_update)]
    if not run_.evals:
        run_.notes.append(f"{path}: no evaluation yet")
    return run_


# --------------------------------------------------------------------------------------------------- numbers


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _sd(xs: Sequence[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) >= 2 else None


def _method_key(method: str, baseline: str) -> tuple[int, int, str]:
    if method == baseline:
        return (0, 0, method)
    order = method_names()  # read live: rows registered after import sort after the built-in ones
    if method in order:
        return (1, order.index(method), method)
    return (2, 0, method)


def _seed_key(r: Run) -> tuple[int, float, str]:
    """Integer seeds in numeric order, then the others as text."""
    if isinstance(r.seed, int) and not isinstance(r.seed, bool):
        return (0, float(r.seed), "")
    return (1, 0.0, str(r.seed))


def composition(run_: Run) -> dict[str, float | None]:
    """Batch-composition summary of one run: per-update means (or last cumulative value) of the sampler stats."""
    out: dict[str, float | None] = {}
    for name, key, how in COMPOSITION:
        vals = [float(r[key]) for r in run_.updates if isinstance(r.get(key), (int, float))]
        out[name] = (_mean(vals) if how == "mean" else vals[-1]) if vals else None
    exp, rec = out.pop("expired"), out.pop("received")
    out["expired"] = exp
    out["expired_fraction"] = exp / rec if exp is not None and rec else None
    return out


def seed_metrics(run_: Run, budget: float | None, tau: float | None, rule: str) -> dict[str, Any]:
    """Every per-run number of the report (SR in percent)."""
    srs = [e.sr for e in run_.evals]
    ff = final_five(srs)
    nauc_value = None
    if budget is not None and run_.evals and run_.evals[0].update <= budget:
        nauc_value = nauc([e.update for e in run_.evals], srs, budget, rule=rule)
    cost = cost_to_target(run_.evals, tau) if tau is not None else None
    return {
        "path": str(run_.path),
        "seed": run_.seed,
        "finished": run_.finished,
        "n_evals": len(run_.evals),
        "last_eval_update": run_.evals[-1].update if run_.evals else None,
        "last_update": run_.last_update,
        "peak_sr": peak_sr(srs),
        "final_five_mean": ff[0] if ff else None,
        "final_five_std": ff[1] if ff else None,
        "final_five_n": min(5, len(srs)),
        "nauc": nauc_value,
        "reached_target": cost is not None,
        "update_to_target": cost.update if cost else None,
        "tokens_to_target": cost.tokens if cost else None,
        "compute_s_to_target": cost.compute_s if cost else None,
        "composition": composition(run_),
    }


def _agg(seeds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    vals = [s[key] for s in seeds if s[key] is not None]
    return {"mean": _mean(vals), "std": _sd(vals), "n": len(vals)}


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders digit runs as numbers: ``load-num_envs4`` before ``load-num_envs16``."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name))


def build_report(
    runs: Sequence[Run],
    *,
    baseline: str = "vanilla",
    targets: dict[str, float] | None = None,
    target_all: float | None = None,
    budget: float | None = None,
    rule: str = "trapezoid",
) -> dict[str, Any]:
    """All numbers of the report as one JSON-able dict (the content of report.json)."""
    targets = targets or {}
    notes: list[str] = [n for r in runs for n in r.notes]
    by_setting: dict[str, dict[str, list[Run]]] = {}
    for r in runs:
        by_setting.setdefault(r.setting, {}).setdefault(r.method, []).append(r)
    unknown = set(targets) - set(by_setting)
    if unknown:
        raise ReportError(f"--target names unknown setting(s) {sorted(unknown)}; settings: {sorted(by_setting)}")
    settings: dict[str, Any] = {}
    for setting in sorted(by_setting, key=natural_key):
        methods = by_setting[setting]
        for method, rs in methods.items():
            seeds = [str(r.seed) for r in rs]
            dup = {s for s in seeds if seeds.count(s) > 1}
            if dup:
                paths = [str(r.path) for r in rs if str(r.seed) in dup]
                raise ReportError(f"setting {setting!r}, method {method!r}: seed(s) {sorted(dup)} twice: {paths}")
            rs.sort(key=_seed_key)
        all_runs = [r for rs in methods.values() for r in rs]
        # Common update budget U: the smallest last-eval update, so every run covers [first eval, U].
        last_evals = [r.evals[-1].update for r in all_runs if r.evals]
        u_budget = budget if budget is not None else (min(last_evals) if last_evals else None)
        if budget is None and u_budget is not None:
            limiting = [str(r.path) for r in all_runs if r.evals and r.evals[-1].update == u_budget and not r.finished]
            if limiting:
                notes.append(f"{setting}: U={u_budget} is set by unfinished run(s) {limiting}")
        firsts = {r.evals[0].update for r in all_runs if r.evals}
        if len(firsts) > 1:
            notes.append(f"{setting}: runs start evaluating at different updates {sorted(firsts)}; nAUC spans differ")
        # Target τ: --target, else the largest multiple of 5 at or below the baseline's peak (mean over its seeds).
        has_baseline = baseline in methods
        baseline_peaks = [p for r in methods.get(baseline, []) if (p := peak_sr([e.sr for e in r.evals])) is not None]
        if setting in targets or target_all is not None:
            tau = targets.get(setting, target_all)
            tau_source = "--target"
        elif baseline_peaks:
            tau = default_target(_mean(baseline_peaks))
            tau_source = f"largest multiple of 5 at or below {baseline}'s mean peak SR {_mean(baseline_peaks):.2f}"
            if tau is None:
                notes.append(f"{setting}: {baseline}'s peak SR is below 5%; no default target")
        else:
            tau, tau_source = None, "none"
            why = "has no evaluation" if has_baseline else "has no run"
            notes.append(f"{setting}: baseline {baseline!r} {why}; no default target, ratios omitted")
        method_out: dict[str, Any] = {}
        for method in sorted(methods, key=lambda m: _method_key(m, baseline)):
            seeds = [seed_metrics(r, u_budget, tau, rule) for r in methods[method]]
            agg = {k: _agg(seeds, k) for k in ("peak_sr", "final_five_mean", "nauc")}
            reached = [s for s in seeds if s["reached_target"]]
            for k in ("tokens_to_target", "compute_s_to_target"):
                vals = [s[k] for s in reached if s[k] is not None]
                agg[k] = {"mean": _mean(vals), "std": _sd(vals), "n": len(vals)}
            agg["reached_target"] = {"n": len(reached), "of": len(seeds)}
            if tau is not None and 0 < len(reached) < len(seeds):
                notes.append(
                    f"{setting}/{method}: reached τ={tau:g} in {len(reached)} of {len(seeds)} seeds; "
                    "its cost to τ is the mean over those seeds"
                )
            if len(seeds) == 1 and seeds[0]["final_five_std"] is not None:
                agg["final_five_mean"]["std_checkpoints"] = seeds[0]["final_five_std"]
            comp_keys = seeds[0]["composition"].keys() if seeds else []
            agg["composition"] = {
                k: _mean([s["composition"][k] for s in seeds if s["composition"][k] is not None]) for k in comp_keys
            }
            uncovered = [s["seed"] for s in seeds if s["nauc"] is None and s["n_evals"]]
            if u_budget is not None and uncovered:
                notes.append(f"{setting}/{method}: seed(s) {uncovered} do not cover the budget U={u_budget}; no nAUC")
            method_out[method] = {"seeds": seeds, "aggregate": agg, "ratios": None}
        if has_baseline and tau is not None:
            base = method_out[baseline]["aggregate"]
            for m in method_out.values():
                m["ratios"] = {
                    "tokens": speedup(base["tokens_to_target"]["mean"], m["aggregate"]["tokens_to_target"]["mean"]),
                    "compute": speedup(
                        base["compute_s_to_target"]["mean"], m["aggregate"]["compute_s_to_target"]["mean"]
                    ),
                }
        elif tau is not None:
            notes.append(f"{setting}: no {baseline!r} run; {baseline}/method ratios omitted")
        settings[setting] = {
            "target": tau,
            "target_source": tau_source,
            "budget": u_budget,
            "baseline": baseline if has_baseline else None,
            "methods": method_out,
        }
    # Geometric-mean speedups across settings, over the settings where the ratio exists (both reached τ).
    geo: dict[str, Any] = {}
    all_methods = sorted({m for s in settings.values() for m in s["methods"]}, key=lambda m: _method_key(m, baseline))
    for method in all_methods:
        entry: dict[str, Any] = {}
        for kind in ("tokens", "compute"):
            present = [s for s in settings.values() if method in s["methods"]]
            vals = [
                s["methods"][method]["ratios"][kind]
                for s in present
                if s["methods"][method]["ratios"] and s["methods"][method]["ratios"][kind] is not None
            ]
            finite = [v for v in vals if math.isfinite(v)]
            entry[kind] = {"geomean": geometric_mean(finite), "n_settings": len(finite), "of": len(present)}
        geo[method] = entry
    return {
        "baseline": baseline,
        "nauc_rule": rule,
        "units": {"sr": "percent", "tokens": "learner tokens (prompt+response)", "compute": "learner compute seconds"},
        "settings": settings,
        "geometric_means": geo,
        "notes": notes,
    }


# --------------------------------------------------------------------------------------------------- writing


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _pm(agg: dict[str, Any], digits: int = 1) -> str:
    if agg["mean"] is None:
        return "–"
    std = agg.get("std")
    if std is None:
        std = agg.get("std_checkpoints")
    return _fmt(agg["mean"], digits) + ("" if std is None else f" ± {_fmt(std, digits)}")


def _ratio(x: float | None) -> str:
    if x is None:
        return "–"
    return "∞" if math.isinf(x) else f"{x:.2f}×"


def _count(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(rep: dict[str, Any], pngs: dict[str, list[str]]) -> str:
    """report.md from the report dict."""
    base = rep["baseline"]
    lines = ["# DivOPD report", ""]
    lines += [
        f"SR in percent. τ: target SR (default: largest multiple of 5 at or below {base}'s peak SR, mean over its "
        f"seeds). Ratios: {base}/method cost through the first eval reaching τ (mean over the seeds that reached it; "
        f"above 1 favours the method; – = not reached). nAUC: mean SR over [first eval, U] ({rep['nauc_rule']} rule). "
        "± : std across seeds when there are ≥ 2, else std across the final five checkpoints.",
        "",
    ]
    for setting, s in rep["settings"].items():
        lines += [f"## {setting}", ""]
        tau = "none" if s["target"] is None else f"{s['target']:g}%"
        lines += [f"τ = {tau} ({s['target_source']}); U = {_fmt(s['budget'], 0)} learner updates.", ""]
        rows = []
        for method, m in s["methods"].items():
            a = m["aggregate"]
            r = m["ratios"] or {}
            reached = a["reached_target"]
            rows.append(
                [
                    method,
                    str(reached["of"]),
                    _pm(a["peak_sr"]),
                    _pm(a["final_five_mean"]),
                    _pm(a["nauc"]),
                    "–" if s["target"] is None else f"{reached['n']}/{reached['of']}",
                    _ratio(r.get("tokens")),
                    _ratio(r.get("compute")),
                ]
            )
        lines += _table(
            ["method", "seeds", "peak SR", "final-five SR", "nAUC", "reached τ", "tokens-to-τ ×", "compute-to-τ ×"],
            rows,
        )
        lines.append("")
        rows = []
        for method, m in s["methods"].items():
            c = m["aggregate"]["composition"]
            rows.append(
                [method]
                + [
                    _count(c.get(k))
                    if k == "expired"
                    else _fmt(c.get(k), 3 if k.endswith(("share", "fraction")) else 2)
                    for k in COMPOSITION_LABELS
                ]
            )
        lines += [
            "Batch composition (per-update means over the run, mean over seeds; expired: final ledger count).",
            "",
        ]
        lines += _table(["method", *COMPOSITION_LABELS.values()], rows)
        lines.append("")
        rows = []
        for method, m in s["methods"].items():
            for sd in m["seeds"]:
                ff = sd["final_five_mean"]
                ff_s = "–" if ff is None else f"{ff:.1f} ± {sd['final_five_std']:.1f} (n={sd['final_five_n']})"
                rows.append(
                    [
                        method,
                        str(sd["seed"]),
                        "done" if sd["finished"] else "running",
                        str(sd["n_evals"]),
                        _fmt(sd["peak_sr"]),
                        ff_s,
                        _fmt(sd["nauc"]),
                        _fmt(sd["update_to_target"], 0) if sd["update_to_target"] is not None else "–",
                        _count(sd["tokens_to_target"]),
                        _count(sd["compute_s_to_target"], 1),
                    ]
                )
        lines += ["Per seed.", ""]
        lines += _table(
            ["method", "seed", "state", "evals", "peak", "final-five", "nAUC", "update→τ", "tokens→τ", "compute s→τ"],
            rows,
        )
        lines.append("")
        lines += [f"![{Path(p).stem}]({p})" for p in pngs.get(setting, [])]
        lines.append("")
    lines += ["## Geometric-mean speedups across settings", ""]
    rows = []
    for method, g in rep["geometric_means"].items():
        if method == base:
            continue
        rows.append(
            [method]
            + [f"{_ratio(g[k]['geomean'])} ({g[k]['n_settings']}/{g[k]['of']} settings)" for k in ("tokens", "compute")]
        )
    if rows:
        lines += _table(["method", "tokens-to-τ ×", "compute-to-τ ×"], rows)
    else:
        lines.append("No method other than the baseline.")
    lines.append("")
    if rep["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in rep["notes"]] + [""]
    return "\n".join(lines)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "setting"


def _curve(run_: Run, x: str) -> tuple[list[float], list[float]]:
    pts = [(getattr(e, x), e.sr) for e in run_.evals if getattr(e, x) is not None]
    return [float(p[0]) for p in pts], [p[1] for p in pts]


def plot_setting(setting: str, runs_by_method: dict[str, list[Run]], tau: float | None, out: Path) -> list[str]:
    """Write the PNGs of one setting; returns their file names (relative to ``out``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    written = []
    slug = _slug(setting)
    color = {m: f"C{i % 10}" for i, m in enumerate(runs_by_method)}  # one colour per method in every figure
    for x, label, stem in (
        ("update", "learner updates", "sr_vs_updates"),
        ("tokens", "learner tokens", "sr_vs_tokens"),
        ("compute_s", "learner compute seconds", "sr_vs_compute"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = False
        for method, rs in runs_by_method.items():
            curves = [c for c in (_curve(r, x) for r in rs) if c[0]]
            if not curves:
                continue
            drawn = True
            if len(curves) == 1:
                ax.plot(curves[0][0], curves[0][1], marker=".", color=color[method], label=method)
                continue
            lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
            if hi <= lo:  # seeds share no x range: draw them separately
                for i, c in enumerate(curves):
                    ax.plot(c[0], c[1], alpha=0.6, color=color[method], label=method if i == 0 else None)
                continue
            grid = np.linspace(lo, hi, 200)
            ys = np.array([np.interp(grid, c[0], c[1]) for c in curves])
            ax.plot(grid, ys.mean(axis=0), color=color[method], label=f"{method} (n={len(curves)})")
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=color[method], alpha=0.2)
        if tau is not None:
            ax.axhline(tau, color="grey", linestyle="--", linewidth=1, label=f"τ = {tau:g}%")
        ax.set_xlabel(label)
        ax.set_ylabel("success rate (%)")
        ax.set_title(f"{setting}: SR vs {label}")
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no evaluation recorded", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        name = f"{slug}_{stem}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)
    # Batch-composition curves: per-update mean over seeds, lightly smoothed.
    panels = [(n, k) for n, k, how in COMPOSITION if how == "mean"]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (name, key) in zip(axes.flat, panels, strict=True):
        for method, rs in runs_by_method.items():
            per_update: dict[int, list[float]] = {}
            for r in rs:
                for rec in r.updates:
                    if isinstance(rec.get(key), (int, float)):
                        per_update.setdefault(rec["update"], []).append(float(rec[key]))
            if not per_update:
                continue
            us = sorted(per_update)
            ys = np.array([sum(per_update[u]) / len(per_update[u]) for u in us])
            w = max(1, len(ys) // 30)
            if w > 1:
                ys = np.convolve(ys, np.ones(w) / w, mode="valid")
                us = us[w - 1 :]
            ax.plot(us, ys, color=color[method], label=method)
        ax.set_title(COMPOSITION_LABELS[name], fontsize=9)
        ax.set_xlabel("learner update", fontsize=8)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"{key}\nnot recorded", ha="center", va="center", fontsize=8, transform=ax.transAxes)
    fig.suptitle(f"{setting}: batch composition")
    fig.tight_layout()
    name = f"{slug}_composition.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    written.append(name)
    return written


def _jsonable(obj: Any) -> Any:
    """report.json is strict JSON: inf becomes the string "inf"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def write_report(runs: Sequence[Run], out: str | Path, *, plots: bool = True, **kwargs: Any) -> dict[str, Any]:
    """Build the report and write report.md, report.json and the PNGs into ``out``; returns the report dict."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = build_report(runs, **kwargs)
    pngs: dict[str, list[str]] = {}
    if plots:
        for setting, s in rep["settings"].items():
            by_method = {m: [r for r in runs if r.setting == setting and r.method == m] for m in s["methods"]}
            pngs[setting] = plot_setting(setting, by_method, s["target"], out)
    rep["plots"] = pngs
    (out / "report.json").write_text(json.dumps(_jsonable(rep), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(rep, pngs), encoding="utf-8")
    return rep


# --------------------------------------------------------------------------------------------------- CLI


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
    """Arguments of ``divopd report``."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, or directories holding them")
    parser.add_argument("--out", default="report", help="output directory (default: ./report)")
    parser.add_argument(
        "--target",
        type=_target,
        action="append",
        default=[],
        metavar="[SETTING=]TAU",
        help="target SR in percent for all settings, or for one (repeatable); default: largest multiple of 5 at or "
        "below the baseline's peak SR",
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="U",
        help="common learner-update budget for nAUC (default: the smallest last-eval update among a setting's runs)",
    )
    parser.add_argument("--baseline", default="vanilla", help="method the ratios compare against (default: vanilla)")
    parser.add_argument("--nauc-rule", choices=("trapezoid", "step"), default="trapezoid", help="nAUC integration rule")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``divopd report``."""
    target_all = None
    targets: dict[str, float] = {}
    for setting, tau in args.target:
        if setting is None:
            target_all = tau
        else:
            targets[setting] = tau
    if args.budget is not None and args.budget < 0:
        raise ReportError(f"--budget must be >= 0, got {args.budget}")
    runs = [load_run(p) for p in find_run_dirs(args.run_dirs)]  # ReportError: one line, exit 2 (divopd.cli)
    rep = write_report(
        runs,
        args.out,
        plots=not args.no_plots,
        baseline=args.baseline,
        targets=targets,
        target_all=target_all,
        budget=args.budget,
        rule=args.nauc_rule,
    )
    n_settings = len(rep["settings"])
    print(f"divopd report: {len(runs)} run(s), {n_settings} setting(s) -> {Path(args.out) / 'report.md'}")
    for note in rep["notes"]:
        print(f"  note: {note}")
    return 0
