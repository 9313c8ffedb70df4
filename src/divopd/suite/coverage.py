"""Replay coverage of the paper suite's runs (the paper's Table 11) on each run's own experience log: replayed under
the run's own rule and settings (**own rule**, mean ± std over a method's seeds) and under each of the paper's rules
with the cap in turns (**shared buffers**, mean ± std over the group's logs)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from divopd.analysis.format import fmt, mean
from divopd.sampling.method_rows import method_names

__all__ = ["PAPER_RULES", "run_coverage", "coverage_markdown"]

#: Selection rules of the shared-buffer table, in the paper's order.
PAPER_RULES: tuple[str, ...] = method_names("coverage")
_KEYS = ("valid_rollouts", "unused_fraction", "effective_rollouts_mean", "max_rollout_share_mean")


def run_coverage(run_dir: str | Path) -> dict[str, Any] | None:
    """Coverage of one run from its own log: ``{"own": {...}, "shared": {rule: {...}}}`` (None: no log yet)."""
    from divopd.analysis.replay import ReplayConfig, replay
    from divopd.sampling.settings import sampler_kwargs
    from divopd.train.config import load_config, sampler_method_for

    run_dir = Path(run_dir)
    log = run_dir / "experience"
    if not log.is_dir() or not any(log.glob("*.parquet")):
        return None
    cfg = load_config(run_dir / "config.yaml")
    s = cfg.sampler
    # every sampler setting of the run (W and the group order included) but the cap unit: the shared table counts turns
    common = {k: v for k, v in sampler_kwargs(s).items() if k != "cap_unit"} | {"updates": cfg.updates,
                                                                                "seed": cfg.seed}
    own_rule = sampler_method_for(cfg.method)
    # One pass over the log serves both tables when the run's cap counts turns; a token cap needs its own replay.
    rules = PAPER_RULES + (() if own_rule in PAPER_RULES else (own_rule,))
    shared = replay(log, ReplayConfig(methods=rules, **common))["methods"]
    own = shared[own_rule] if s.cap_unit == "turns" else \
        replay(log, ReplayConfig(methods=(own_rule,), cap_unit=s.cap_unit, **common))["methods"][own_rule]
    return {"rule": own_rule, "cap_unit": s.cap_unit, "own": {k: own[k] for k in _KEYS},
            "shared": {m: {k: shared[m][k] for k in _KEYS} for m in PAPER_RULES}}


def _pm(values: list[float | None], scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    """Mean ± std over the values that are not ``None`` (one value: itself; none: :data:`format.MISSING`)."""
    xs = [v * scale for v in values if v is not None]
    if len(xs) < 2:
        return fmt(mean(xs), digits) + (unit if xs else "")
    return f"{fmt(mean(xs), digits)} ± {fmt(statistics.stdev(xs), digits)}{unit}"


def _row(name: str, items: list[dict[str, Any]]) -> str:
    return (f"| {name} | {len(items)} | {_pm([x['valid_rollouts'] for x in items], digits=0)} | "
            f"{_pm([x['unused_fraction'] for x in items], 100, unit='%')} | "
            f"{_pm([x['effective_rollouts_mean'] for x in items], digits=2)} | "
            f"{_pm([x['max_rollout_share_mean'] for x in items], 100, unit='%')} |")


def coverage_markdown(by_label: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The two tables for one group, from ``{label: [run_coverage(...) per seed]}`` (runs without a log left out)."""
    by_label = {label: [c for c in covs if c is not None] for label, covs in by_label.items()}
    by_label = {label: covs for label, covs in by_label.items() if covs}
    if not by_label:
        return ["No run of this group has an experience log yet."]
    head = ["| {} | logs | valid rollouts / log | unused | eff. rollouts / batch | max rollout share |",
            "|---|---:|---:|---:|---:|---:|"]
    lines = ["Own rule on own log (each run's log replayed under its own selection rule and settings; mean ± std "
             "over seeds).", "", head[0].format("method (rule)"), head[1]]
    for label, covs in by_label.items():
        rule = covs[0]["rule"] + (", token cap" if covs[0]["cap_unit"] == "tokens" else "")
        lines.append(_row(f"{label} ({rule})", [c["own"] for c in covs]))
    every = [c for covs in by_label.values() for c in covs]
    lines += ["", f"Shared buffers (each of the {len(every)} logs of the group replayed under every paper rule, "
              "cap in turns; mean ± std over logs).", "", head[0].format("rule"), head[1]]
    for rule in PAPER_RULES:
        lines.append(_row(rule, [c["shared"][rule] for c in every]))
    return lines
