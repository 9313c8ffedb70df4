"""The numbers of ``divopd report``: per-run SR statistics (peak, final five, nAUC, cost to the target τ), batch
composition, per-method aggregates over seeds, baseline/method ratios and geometric-mean speedups across settings;
:func:`build_report` returns them as one JSON-able dict, the content of ``report.json``."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from typing import Any

from divopd.analysis.format import mean as _mean
from divopd.analysis.report.load import ReportError, Run
from divopd.analysis.report.stats import bootstrap_ci, paired_values, wilcoxon_signed_rank
from divopd.experience.metrics import (
    cost_to_target,
    default_target,
    final_five,
    geometric_mean,
    nauc,
    peak_sr,
    speedup,
)
from divopd.sampling.method_rows import method_names
from divopd.train.config import PLACEMENT_KEYS

__all__ = ["COMPOSITION", "COMPOSITION_LABELS", "DIAGNOSTICS", "PAIRED_TESTS", "build_report", "composition",
           "diagnostics", "natural_key", "paired_tests", "seed_metrics", "unlike_seeds"]

#: Batch-composition columns: (report key, metrics.jsonl key, how the run's per-update values are summarised).
COMPOSITION = (
    ("effective_rollouts", "sampler/effective_rollouts", "mean"),
    ("max_rollout_share", "sampler/max_rollout_share", "mean"),
    ("dead_rows", "sampler/dead_rows", "mean"),
    ("mean_staleness", "sampler/mean_staleness", "mean"),
    ("disagreement_std_across_rollouts", "sampler/disagreement_std_across_rollouts", "mean"),
    ("arrival_drain_ratio", "queue/arrival_drain_ratio", "mean"),
    ("producer_load", "queue/producer_load", "last"),
    ("expired", "ledger/expired", "last"),
    ("received", "ledger/received", "last"),
)
#: The diagnostics of the paper's tables (functions in :mod:`divopd.sampling.paper_diagnostics`): (report key,
#: metrics.jsonl key, summary over the run's updates, column label, where the paper reports it). ``mean``: mean over
#: updates; ``last``: the last value (cumulative counters, the EMA). Table 11 and Table 14 are shared-buffer replays
#: (``divopd replay``); Table 12's mean age is ``sampler/mean_staleness``.
DIAGNOSTICS: tuple[tuple[str, str, str, str, str], ...] = (
    ("effective_rollouts", "sampler/effective_rollouts", "mean", "eff. rollouts", "Table 9"),
    ("top1_token_share", "sampler/max_rollout_share", "mean", "top-1 token share", "Table 9"),
    ("turns_per_rollout", "sampler/turns_per_rollout", "mean", "turns/rollout", "Table 9"),
    ("kl_per_token", "sampler/kl_per_token", "mean", "KL/token", "Table 9"),
    ("step_time_s", "learner/compute_s", "mean", "step s", "Table 9"),
    ("mean_age", "sampler/mean_staleness", "mean", "mean age", "Table 12"),
    ("teacher_tokens_per_trained_token", "sampler/teacher_tokens_per_trained_token", "last",
     "teacher tok/trained tok", "Table 16"),
    ("disagreement_std_ema", "sampler/disagreement_std_ema", "last", "disagr. std EMA (final)", "Figure 6"),
)
#: The paired comparisons of the report: (method, against, what the difference isolates). ``None`` as the
#: comparison stands for the report's baseline. Each is a Wilcoxon signed-rank test over the seeds both ran, on the
#: per-seed nAUC and, over the seeds where both reached τ, on tokens-to-τ.
PAIRED_TESTS: tuple[tuple[str, str | None, str], ...] = (
    ("divopd", None, "DivOPD vs the baseline"),
    ("divopd-base", "nocap", "the cap"),
    ("divopd", "divopd-base", "focus"),
    ("divopd-base", "vanilla-pool", "selection with the same candidates"),
    ("vanilla-pool", None, "the validity gate"),
)
#: Config keys in which the seeds of one method may differ: the seed, the setting's name (``divopd bench`` relabels its
#: groups), where the run is written and where it executes.
SEED_KEYS = ("seed", "setting", "out_dir", "run_dir", *PLACEMENT_KEYS)

#: Per-seed metrics the paired tests compare: (seed_metrics key, label).
PAIRED_METRICS = (("nauc", "nAUC"), ("tokens_to_target", "tokens-to-τ"))
#: Column labels of the composition table, in its order.
COMPOSITION_LABELS = {"effective_rollouts": "eff. rollouts", "max_rollout_share": "max share", "dead_rows": "dead rows",
                      "mean_staleness": "staleness", "disagreement_std_across_rollouts": "disagr. std",
                      "arrival_drain_ratio": "arrival/drain", "producer_load": "producer load", "expired": "expired",
                      "expired_fraction": "expired/recv."}


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


def _summarise(run_: Run, key: str, how: str) -> float | None:
    """The run's per-update values of ``key``: their mean (``how == "mean"``) or the last one; ``None`` without any."""
    vals = [float(v) for r in run_.updates
            if isinstance(v := r.get(key), (int, float)) and not isinstance(v, bool)]
    return (_mean(vals) if how == "mean" else vals[-1]) if vals else None


def composition(run_: Run) -> dict[str, float | None]:
    """Batch-composition summary of one run: per-update means (or last cumulative value) of the sampler stats."""
    out: dict[str, float | None] = {name: _summarise(run_, key, how) for name, key, how in COMPOSITION}
    exp, rec = out.pop("expired"), out.pop("received")
    out["expired"] = exp
    out["expired_fraction"] = exp / rec if exp is not None and rec else None
    return out


def diagnostics(run_: Run) -> dict[str, float | None]:
    """The paper-table diagnostics of one run (:data:`DIAGNOSTICS`), ``None`` where the run did not record them."""
    return {name: _summarise(run_, key, how) for name, key, how, _, _ in DIAGNOSTICS}


def seed_metrics(run_: Run, budget: float | None, tau: float | None, rule: str) -> dict[str, Any]:
    """Every per-run number of the report (SR in percent)."""
    srs = [e.sr for e in run_.evals]
    ff = final_five(srs)
    nauc_value = None
    if budget is not None and run_.evals and run_.evals[0].update <= budget:
        nauc_value = nauc([e.update for e in run_.evals], srs, budget, rule=rule)
    cost = cost_to_target(run_.evals, tau) if tau is not None else None
    return {"path": str(run_.path), "seed": run_.seed, "finished": run_.finished, "n_evals": len(run_.evals),
            "last_eval_update": run_.evals[-1].update if run_.evals else None, "last_update": run_.last_update,
            "peak_sr": peak_sr(srs), "final_five_mean": ff[0] if ff else None,
            "final_five_std": ff[1] if ff else None, "final_five_n": min(5, len(srs)), "nauc": nauc_value,
            "reached_target": cost is not None, "update_to_target": cost.update if cost else None,
            "tokens_to_target": cost.tokens if cost else None,
            "compute_s_to_target": cost.compute_s if cost else None, "sr_curve": [[e.update, e.sr] for e in run_.evals],
            "composition": composition(run_), "diagnostics": diagnostics(run_)}


def _agg(seeds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Mean, std and 95% percentile-bootstrap CI (``None`` under two seeds) of a per-seed metric."""
    vals = [s[key] for s in seeds if s[key] is not None]
    std = statistics.stdev(vals) if len(vals) >= 2 else None
    return {"mean": _mean(vals), "std": std, "n": len(vals), "ci95": bootstrap_ci(vals)}


def paired_tests(methods: dict[str, dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """The :data:`PAIRED_TESTS` whose two methods both ran (``methods``: method -> its report entry): one Wilcoxon
    signed-rank test per metric, seeds paired; none without a common seed, ``p_value`` ``None`` when all pairs tie."""
    out = []
    for method, against, question in PAIRED_TESTS:
        against = against or baseline
        if method == against or method not in methods or against not in methods:
            continue
        for key, label in PAIRED_METRICS:
            per = [{s["seed"]: s[key] for s in methods[m]["seeds"] if isinstance(s["seed"], int)}
                   for m in (method, against)]
            seeds, x, y = paired_values(per[0], per[1])
            if not seeds:
                continue
            test = wilcoxon_signed_rank(x, y)
            out.append({"method": method, "against": against, "question": question, "metric": key, "label": label,
                        "seeds": seeds, "mean_method": _mean(x), "mean_against": _mean(y), **test})
    return out


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders digit runs as numbers: ``load-num_envs4`` before ``load-num_envs16``."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name))


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True, default=str)
    return out


def unlike_seeds(runs: Sequence[Run]) -> str | None:
    """How the configs of one method's runs differ beyond :data:`SEED_KEYS` (``None``: they are seeds of one
    config): the differing keys, then each distinct combination of their values with its runs. A key that only some
    configs hold (written by another divopd version) is not compared."""
    flat = [_flat(r.config) for r in runs]
    shared = set.intersection(*(set(f) for f in flat)) if flat else set()
    keys = sorted(k for k in shared if k not in SEED_KEYS and len({f[k] for f in flat}) > 1)
    if not keys:
        return None
    groups: dict[str, list[str]] = {}
    for r, f in zip(runs, flat, strict=True):
        groups.setdefault(", ".join(f"{k}={f[k]}" for k in keys), []).append(str(r.path))
    shown = "; ".join(f"{values}: {' '.join(paths)}" for values, paths in groups.items())
    return f"{', '.join(keys)} ({shown})"


def _check_seeds(setting: str, methods: dict[str, list[Run]]) -> None:
    """A seed at most once per method; each method's runs in seed order."""
    for method, rs in methods.items():
        seeds = [str(r.seed) for r in rs]
        dup = {s for s in seeds if seeds.count(s) > 1}
        if dup:
            paths = [str(r.path) for r in rs if str(r.seed) in dup]
            raise ReportError(f"setting {setting!r}, method {method!r}: seed(s) {sorted(dup)} twice: {paths}")
        rs.sort(key=_seed_key)


def _budget(setting: str, all_runs: list[Run], budget: float | None, notes: list[str]) -> float | None:
    """Common update budget U: ``budget``, else the smallest last-eval update of the finished runs, so every finished
    run covers [first eval, U]; a run still in progress that has not reached U yet gets no nAUC (a note says so)
    instead of shrinking every run's span. With no finished run, the smallest last-eval update of all runs."""
    evaluated = [r for r in all_runs if r.evals]
    finished = [r for r in evaluated if r.finished]
    pool = finished or evaluated
    u_budget = budget if budget is not None else (min(r.evals[-1].update for r in pool) if pool else None)
    if budget is None and u_budget is not None and not finished:
        notes.append(f"{setting}: no run has finished; U={u_budget} is the smallest last evaluation of the runs so far")
    elif budget is None and u_budget is not None:
        behind = [str(r.path) for r in evaluated if not r.finished and r.evals[-1].update < u_budget]
        if behind:
            notes.append(f"{setting}: U={u_budget} (finished runs); unfinished run(s) {behind} have not reached it")
    firsts = {r.evals[0].update for r in all_runs if r.evals}
    if len(firsts) > 1:
        notes.append(f"{setting}: runs start evaluating at different updates {sorted(firsts)}; nAUC spans differ")
    return u_budget


def _target(setting: str, methods: dict[str, list[Run]], baseline: str, targets: dict[str, float],
            target_all: float | None, notes: list[str]) -> tuple[float | None, str]:
    """Target τ and where it came from: --target, else the largest multiple of 5 at or below the baseline's peak
    (mean over its seeds)."""
    baseline_peaks = [p for r in methods.get(baseline, []) if (p := peak_sr([e.sr for e in r.evals])) is not None]
    if setting in targets or target_all is not None:
        return targets.get(setting, target_all), "--target"
    if baseline_peaks:
        tau = default_target(_mean(baseline_peaks))
        if tau is None:
            notes.append(f"{setting}: {baseline}'s peak SR is below 5%; no default target")
        return tau, f"largest multiple of 5 at or below {baseline}'s mean peak SR {_mean(baseline_peaks):.2f}"
    why = "has no evaluation" if baseline in methods else "has no run"
    notes.append(f"{setting}: baseline {baseline!r} {why}; no default target, ratios omitted")
    return None, "none"


def _method_entry(setting: str, method: str, runs: list[Run], u_budget: float | None, tau: float | None,
                  rule: str, notes: list[str]) -> dict[str, Any]:
    """Per-seed rows and the aggregate over seeds of one method in one setting (``ratios`` filled in later)."""
    seeds = [seed_metrics(r, u_budget, tau, rule) for r in runs]
    agg = {k: _agg(seeds, k) for k in ("peak_sr", "final_five_mean", "nauc")}
    reached = [s for s in seeds if s["reached_target"]]
    for k in ("tokens_to_target", "compute_s_to_target"):
        agg[k] = _agg(reached, k)  # over the seeds that reached τ
    agg["reached_target"] = {"n": len(reached), "of": len(seeds)}
    if tau is not None and 0 < len(reached) < len(seeds):
        notes.append(f"{setting}/{method}: reached τ={tau:g} in {len(reached)} of {len(seeds)} seeds; its cost to τ is "
                     "the mean over those seeds")
    if len(seeds) == 1 and seeds[0]["final_five_std"] is not None:
        agg["final_five_mean"]["std_checkpoints"] = seeds[0]["final_five_std"]
    comp_keys = seeds[0]["composition"].keys() if seeds else []
    agg["composition"] = {k: _mean([s["composition"][k] for s in seeds]) for k in comp_keys}
    agg["diagnostics"] = {k: _mean([s["diagnostics"][k] for s in seeds]) for k, *_ in DIAGNOSTICS}
    uncovered = [s["seed"] for s in seeds if s["nauc"] is None and s["n_evals"]]
    if u_budget is not None and uncovered:
        notes.append(f"{setting}/{method}: seed(s) {uncovered} do not cover the budget U={u_budget}; no nAUC")
    return {"seeds": seeds, "aggregate": agg, "ratios": None}


def _setting_entry(setting: str, methods: dict[str, list[Run]], *, baseline: str, targets: dict[str, float],
                   target_all: float | None, budget: float | None, rule: str, notes: list[str]) -> dict[str, Any]:
    """report.json's entry of one setting: τ, U, and per method its seeds, aggregate and ratios to the baseline."""
    _check_seeds(setting, methods)
    u_budget = _budget(setting, [r for rs in methods.values() for r in rs], budget, notes)
    tau, tau_source = _target(setting, methods, baseline, targets, target_all, notes)
    has_baseline = baseline in methods
    method_out = {method: _method_entry(setting, method, methods[method], u_budget, tau, rule, notes)
                  for method in sorted(methods, key=lambda m: _method_key(m, baseline))}
    if has_baseline and tau is not None:
        base = method_out[baseline]["aggregate"]
        for m in method_out.values():
            m["ratios"] = {
                "tokens": speedup(base["tokens_to_target"]["mean"], m["aggregate"]["tokens_to_target"]["mean"]),
                "compute": speedup(base["compute_s_to_target"]["mean"], m["aggregate"]["compute_s_to_target"]["mean"]),
            }
    elif tau is not None:
        notes.append(f"{setting}: no {baseline!r} run; {baseline}/method ratios omitted")
    return {"target": tau, "target_source": tau_source, "budget": u_budget,
            "baseline": baseline if has_baseline else None, "methods": method_out,
            "paired_tests": paired_tests(method_out, baseline)}


def _geometric_means(settings: dict[str, Any], baseline: str) -> dict[str, Any]:
    """Geometric-mean speedups across settings, over the settings where the ratio exists (both reached τ)."""
    geo: dict[str, Any] = {}
    all_methods = sorted({m for s in settings.values() for m in s["methods"]}, key=lambda m: _method_key(m, baseline))
    for method in all_methods:
        entry: dict[str, Any] = {}
        for kind in ("tokens", "compute"):
            present = [s for s in settings.values() if method in s["methods"]]
            vals = [s["methods"][method]["ratios"][kind] for s in present
                    if s["methods"][method]["ratios"] and s["methods"][method]["ratios"][kind] is not None]
            finite = [v for v in vals if math.isfinite(v)]
            entry[kind] = {"geomean": geometric_mean(finite), "n_settings": len(finite), "of": len(present)}
        entry["min_seeds"] = min((len(s["methods"][m]["seeds"]) for s in present for m in (method, baseline)
                                  if m in s["methods"]), default=0)  # the fewest seeds behind any of its ratios
        geo[method] = entry
    return geo


def _sample_size_notes(settings: dict[str, Any], baseline: str) -> list[str]:
    """What a setting's runs cannot decide: one method alone compares nothing; one seed of a method decides nothing."""
    notes = []
    for name, s in settings.items():
        methods = s["methods"]
        if len(methods) == 1:
            (only,) = methods
            notes.append(f"{name}: only method {only} ({len(methods[only]['seeds'])} run(s)): nothing is compared; "
                         f"its runs are seeds of one method, and a comparison needs a second method (e.g. "
                         f"{baseline if only != baseline else 'divopd'})")
        single = [m for m in methods if len(methods[m]["seeds"]) == 1]
        if single and len(methods) > 1:
            notes.append(f"{name}: n = 1 seed for {', '.join(single)}: one seed decides nothing; a difference between "
                         "methods needs several seeds of each (--set seed=N)")
    return notes


def build_report(runs: Sequence[Run], *, baseline: str = "vanilla", targets: dict[str, float] | None = None,
                 target_all: float | None = None, budget: float | None = None, rule: str = "trapezoid",
                 group_anyway: bool = False) -> dict[str, Any]:
    """All numbers of the report as one JSON-able dict (the content of report.json). Runs of one method whose configs
    differ beyond the seed raise :class:`ReportError` naming the keys and runs; ``group_anyway`` pools them as seeds
    with a note."""
    targets = targets or {}
    notes: list[str] = [n for r in runs for n in r.notes]
    by_setting: dict[str, dict[str, list[Run]]] = {}
    for r in runs:
        by_setting.setdefault(r.setting, {}).setdefault(r.method, []).append(r)
    for setting, methods in by_setting.items():
        for method, method_runs in methods.items():
            unlike = unlike_seeds(method_runs)
            if unlike is not None and not group_anyway:
                raise ReportError(f"setting {setting!r}, method {method!r}: the runs differ in more than the seed: "
                                  f"{unlike}; report them apart, or pass --group-anyway to pool them as seeds")
            if unlike is not None:
                notes.append(f"{setting}/{method}: pooled as seeds (--group-anyway), though the runs differ in "
                             f"{unlike}")
    unknown = set(targets) - set(by_setting)
    if unknown:
        raise ReportError(f"--target names unknown setting(s) {sorted(unknown)}; settings: {sorted(by_setting)}")
    settings = {
        setting: _setting_entry(setting, by_setting[setting], baseline=baseline, targets=targets,
                                target_all=target_all, budget=budget, rule=rule, notes=notes)
        for setting in sorted(by_setting, key=natural_key)
    }
    notes += _sample_size_notes(settings, baseline)
    units = {"sr": "percent", "tokens": "learner tokens (prompt+response)", "compute": "learner compute seconds"}
    return {"baseline": baseline, "nauc_rule": rule, "units": units, "settings": settings,
            "geometric_means": _geometric_means(settings, baseline), "notes": notes}
