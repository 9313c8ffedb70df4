"""Choose the cap k from an experience log (``divopd tune-cap``; beyond the paper): :func:`tune_cap` replays one log
at each candidate k (:func:`~divopd.analysis.replay.replay`, one pass per k) and :func:`recommend_cap` picks one k
(docs/guides/tune-cap.md). A replay measures selection, not learning."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from divopd.analysis.format import mean as _mean
from divopd.analysis.replay import ReplayConfig, replay, resolve_source, write_json
from divopd.analysis.tune_cap_output import markdown_table, plot_tune_cap, render_table, title
from divopd.experience.log import LoggedTurn
from divopd.sampling.settings import add_sampler_flags, settings_from_args

__all__ = ["CAP_METHODS", "DEFAULT_CAPS", "INF_CAP", "add_arguments", "markdown_table", "parse_caps", "plot_tune_cap",
           "recommend_cap", "render_table", "run", "title", "tune_cap"]

DEFAULT_CAPS: tuple[int, ...] = (2, 3, 4, 6, 8)
#: Stand-in for k = ∞ (``inf`` in ``--caps``): a first-pass cap no rollout reaches, i.e. no cap.
INF_CAP = 2**31 - 1
#: Methods whose batches depend on the cap (rollout-first with a cap k).
CAP_METHODS: tuple[str, ...] = ("divopd-base", "divopd")
#: Methods that ignore the cap: tuning k for them is refused with this reason.
_CAPLESS = {
    "vanilla": "reads the queue in arrival order",
    "vanilla-pool": "takes the oldest pooled turns",
    "nocap": "is rollout-first with k = ∞",
    "top-b": "ranks all candidates globally",
    "divopd-focus": "uses its own fixed caps (3 turns, 25% token share per task)",
}


def cap_label(cap: int) -> int | str:
    """``"inf"`` for :data:`INF_CAP`, else the cap itself."""
    return "inf" if cap == INF_CAP else cap


def parse_caps(text: str | Sequence[int | str]) -> list[int]:
    """``"2,3,4,6,8"`` (or a sequence) -> sorted distinct caps; ``inf`` means no cap (:data:`INF_CAP`)."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    caps: list[int] = []
    for item in items:
        if item == "":
            continue
        if isinstance(item, str) and item.lower() in ("inf", "none", "∞"):
            caps.append(INF_CAP)
            continue
        try:
            cap = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"--caps: {item!r} is not an integer k >= 1 or 'inf'") from None
        if isinstance(item, bool) or cap < 1 or (isinstance(item, float) and item != cap):
            raise ValueError(f"--caps: {item!r} is not an integer k >= 1 or 'inf'")
        caps.append(cap)
    if not caps:
        raise ValueError("--caps: give at least one cap")
    return sorted(set(caps))


def _cap_row(cap: int, batch_size: int, m: dict[str, Any]) -> dict[str, Any]:
    """One k's coverage row from the replay result ``m`` of the method."""
    distinct = [d for d in m["series"]["distinct_rollouts"] if d is not None]
    promised = math.ceil(batch_size / cap)
    return {
        "cap": cap_label(cap),
        **{k: m[k] for k in ("starved", "updates", "valid_rollouts", "used_rollouts", "undecided_rollouts",
                             "unused_fraction", "effective_rollouts_mean", "max_rollout_share_mean",
                             "dead_row_fraction")},
        "distinct_rollouts_mean": _mean(distinct),
        "distinct_rollouts_min": min(distinct) if distinct else None,
        "promised_rollouts": promised,
        "cap_binds_fraction": (sum(d >= promised for d in distinct) / len(distinct)) if distinct else None,
        "mean_staleness": _mean(m["series"]["mean_staleness"]),
        **{k: m[k] for k in ("selected", "expired", "invalid")},
    }


def recommend_cap(rows: Sequence[dict[str, Any]], unused_tol: float = 0.02,
                  eff_tol: float = 0.10) -> tuple[int | str | None, str]:
    """Pick k from :func:`tune_cap`'s rows: the fewest starved ticks, then unused fraction within ``unused_tol`` of
    the best, then effective rollouts ≥ ``(1 − eff_tol)`` × the best among those, then the largest k left (coverage
    and spread are what a cap buys; among caps a replay cannot tell apart, the loosest fragments rollouts least).
    ``unused_tol`` is absolute (0.02 = 2 points), ``eff_tol`` relative (0.10 = within 10 %). Returns ``(cap, reason)``;
    cap is ``None`` when no k composed a batch."""
    if unused_tol < 0 or not 0 <= eff_tol < 1:
        raise ValueError(f"unused_tol must be >= 0 and eff_tol in [0, 1), got {unused_tol}, {eff_tol}")
    live = [r for r in rows if r["updates"] > 0]
    if not live:
        return None, "no cap composed a batch (every tick starved): the log is too short or B too large"
    steps = []
    fewest = min(r["starved"] for r in live)
    keep = [r for r in live if r["starved"] == fewest]
    steps.append(f"{len(keep)} of {len(live)} caps have the fewest starved ticks ({fewest})")
    unused = [r["unused_fraction"] for r in keep if r["unused_fraction"] is not None]
    if unused:
        best = min(unused)
        keep = [r for r in keep
                if r["unused_fraction"] is not None and r["unused_fraction"] <= best + unused_tol + 1e-12]
        steps.append(f"unused fraction within {100 * unused_tol:g} points of the best {100 * best:.1f}%: {_caps(keep)}")
    else:
        steps.append("no valid rollout decided: coverage not compared")
    best_eff = max(r["effective_rollouts_mean"] for r in keep)
    keep = [r for r in keep if r["effective_rollouts_mean"] >= (1 - eff_tol) * best_eff - 1e-12]
    steps.append(f"effective rollouts >= {100 * (1 - eff_tol):g}% of the best {best_eff:.1f}: {_caps(keep)}")
    pick = max(keep, key=lambda r: INF_CAP if r["cap"] == "inf" else r["cap"])["cap"]
    steps.append(f"the largest: k = {pick}")
    return pick, "; ".join(steps)


def _caps(rows: Sequence[dict[str, Any]]) -> str:
    return "k ∈ {" + ", ".join(str(r["cap"]) for r in rows) + "}"


def tune_cap(log: str | os.PathLike | Iterable[LoggedTurn], caps: Sequence[int | str] | str = DEFAULT_CAPS, *,
             method: str = "divopd-base", batch_size: int = 256, pool_factor: float = 4, max_staleness: int = 2,
             updates: int | None = None, cap_unit: str = "turns", seed: int = 0, max_pending: int | None = None,
             unused_tol: float = 0.02, eff_tol: float = 0.10, max_pending_age: int | None = 8,
             group_order: str = "first-seen") -> dict[str, Any]:
    """Replay ``log`` with ``method`` at every cap in ``caps`` (each k on the same experience) and recommend one
    (:func:`recommend_cap`). Returns a JSON-able dict: ``log``, ``config``, ``updates``, ``delivered_turns``,
    ``delivered_rollouts``, ``arrival_drain_ratio``, ``caps`` (one row per k), ``recommended`` (k, ``"inf"`` or None),
    ``reason`` and ``rule`` (the tolerances)."""
    if method in _CAPLESS:
        raise ValueError(f"method {method!r} {_CAPLESS[method]}: the cap does not change its batches; use one of "
                         f"{', '.join(CAP_METHODS)}")
    cap_list = parse_caps(caps)
    shared = {"batch_size": batch_size, "pool_factor": pool_factor, "max_staleness": max_staleness,
              "max_pending": max_pending, "cap_unit": cap_unit, "max_pending_age": max_pending_age,
              "group_order": group_order}
    if updates is not None and updates < 1:
        raise ValueError(f"--updates must be >= 1, got {updates}")
    log_name, source, updates = resolve_source(log, updates, "tune-cap", reuse=True)
    rows = []
    first: dict[str, Any] | None = None
    for cap in cap_list:
        config = ReplayConfig(methods=(method,), cap=cap, updates=updates, seed=seed, **shared)
        result = replay(source, config)
        first = first or result
        rows.append(_cap_row(cap, batch_size, result["methods"][method]))
    assert first is not None
    pick, reason = recommend_cap(rows, unused_tol=unused_tol, eff_tol=eff_tol)
    return {
        "log": log_name,
        "config": {"method": method, "caps": [cap_label(c) for c in cap_list], **shared, "updates": updates,
                   "seed": seed},
        "updates": updates,
        "delivered_turns": first["delivered_turns"],
        "delivered_rollouts": first["delivered_rollouts"],
        "arrival_drain_ratio": first["arrival_drain_ratio"],
        "caps": rows,
        "recommended": pick,
        "reason": reason,
        "rule": {"unused_tol": unused_tol, "eff_tol": eff_tol},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", help="experience log: a .parquet file or a directory of part-*.parquet files")
    parser.add_argument("--caps", default=",".join(map(str, DEFAULT_CAPS)), help="candidate caps, 'inf' = no cap")
    parser.add_argument("--method", default="divopd-base", help=f"rollout-first method ({', '.join(CAP_METHODS)})")
    add_sampler_flags(parser, defaults={"batch_size": 256}, skip=("cap",))  # from divopd.sampling.settings
    parser.add_argument("--updates", type=int, default=None, help="U ticks (default: through the last arrival_update)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--unused-tol", type=float, default=0.02, help="rule: unused fraction tolerance (absolute)")
    parser.add_argument("--eff-tol", type=float, default=0.10, help="rule: effective rollouts tolerance (relative)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the per-k results here")
    parser.add_argument("--markdown", default=None, help="write the table as Markdown here")
    parser.add_argument("--plot", default=None, help="write a PNG (unused fraction, effective rollouts over k) here")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from divopd.errors import UsageError

    console = Console(width=None if Console().is_terminal else 180)
    try:
        result = tune_cap(args.log, args.caps, method=args.method, updates=args.updates, seed=args.seed,
                          unused_tol=args.unused_tol, eff_tol=args.eff_tol, **settings_from_args(args, skip=("cap",)))
    except ValueError as exc:  # the options, or the log (an ExperienceLogError): one line, exit 2 (divopd.cli)
        if isinstance(exc, UsageError):
            raise
        raise UsageError(str(exc)) from exc
    console.print(render_table(result))
    console.print(f"recommended k = {result['recommended']}  ({result['reason']})")
    if args.json_out:
        write_json(result, args.json_out)
        console.print(f"wrote {args.json_out}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(f"{title(result)}\n\n{markdown_table(result)}\n")
        console.print(f"wrote {args.markdown}")
    if args.plot:
        plot_tune_cap(result, args.plot)
        console.print(f"wrote {args.plot}")
    return 0
