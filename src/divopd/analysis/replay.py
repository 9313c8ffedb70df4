"""Shared-buffer replay: run several selection rules over one experience log (paper, Appendix Table 11), every method
on the same experience tick by tick (the rule: docs/guides/replay.md). The log is streamed once; the methods advance in
lockstep and share the same :class:`~divopd.Turn` objects, so memory holds one record batch and the turns some sampler
still waits on."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import divopd.sampling.gate as gate
import divopd.sampling.paper_diagnostics as pd
from divopd.analysis.format import divide
from divopd.analysis.replay_output import (
    plot_replay,
    render_diagnostics,
    render_selection_chain,
    render_table,
    write_json,
)
from divopd.analysis.replay_rules import cell_counts, deliveries, log_updates, rollout_coverage, waiting_rollouts
from divopd.experience import Turn
from divopd.experience.log import LoggedTurn, read_log
from divopd.sampling import METHODS, Sampler, SamplerConfig, make_sampler
from divopd.sampling.method_rows import method_names
from divopd.sampling.settings import add_sampler_flags, sampler_kwargs, settings_from_args

__all__ = ["CHAIN_METHODS", "DEFAULT_METHODS", "ReplayConfig", "add_arguments", "deliveries", "log_updates",
           "plot_replay", "render_diagnostics", "render_selection_chain", "render_table", "replay", "resolve_source",
           "rollout_coverage", "run", "write_json"]

DEFAULT_METHODS: tuple[str, ...] = method_names("replay")
#: Table 14's selection chain: vanilla, +gate, +coverage, +focus (``--selection-chain``).
CHAIN_METHODS: tuple[str, ...] = ("vanilla", "vanilla-pool", "divopd-base", "divopd")
#: The per-method JSON keys (in this order), besides ``series`` and ``ledger``.
RESULT_KEYS: tuple[str, ...] = (
    "updates", "starved", "valid_rollouts", "used_rollouts", "undecided_rollouts", "unused_fraction",
    "effective_rollouts_mean", "max_rollout_share_mean", "candidate_rollouts_mean", "dead_row_fraction", "selected",
    "expired", "invalid")
#: The diagnostics of the paper's tables in each method's entry (after :data:`RESULT_KEYS`).
TABLE_KEYS: tuple[str, ...] = ("never_selected_share", "selection_gini", "turns_per_rollout_mean", "kl_per_token_mean",
                               "mean_age", "disagreement_std_ema", "teacher_tokens_per_trained_token",
                               "never_selected_scored_share", "selected_by_cell", "selection_chain")
#: Per-update series of each method (one value per tick; ``None`` where the tick was starved).
SERIES_KEYS: tuple[str, ...] = ("batch", "effective_rollouts", "max_rollout_share", "dead_rows", "distinct_rollouts",
                                "candidate_rollouts", "mean_staleness", "selected", "expired", "invalid", "waiting",
                                "used_rollouts", "turns_per_rollout", "kl_per_token", "disagreement_std_ema")


@dataclass
class ReplayConfig:
    """Settings shared by every replayed method: ``methods`` (``divopd.sampling.METHODS``, replayed side by side),
    ``updates`` (U ticks; ``None`` = through the log's last ``arrival_update``), the sampler ``seed``, and the sampler
    settings of :class:`~divopd.sampling.SamplerConfig` under the same names (B, c, k, S, W, ...)."""

    methods: Sequence[str] = DEFAULT_METHODS
    batch_size: int = 256
    pool_factor: float = 4
    cap: int = 4
    max_staleness: int = 2
    updates: int | None = None
    seed: int = 0
    max_pending: int | None = None
    cap_unit: str = "turns"
    max_pending_age: int | None = 8
    group_order: str = "first-seen"

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        if not self.methods:
            raise ValueError("ReplayConfig.methods: give at least one method")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"ReplayConfig.methods: duplicate method in {list(self.methods)}")
        for m in self.methods:
            if m not in METHODS:
                raise ValueError(f"unknown method {m!r}; known: {', '.join(sorted(METHODS))}")
        if self.updates is not None and (isinstance(self.updates, bool) or self.updates < 1):
            raise ValueError(f"ReplayConfig.updates must be >= 1, got {self.updates!r}")
        self.sampler_config(self.methods[0])  # validates the shared settings

    def sampler_config(self, method: str) -> SamplerConfig:
        return SamplerConfig(method=method, seed=self.seed, **sampler_kwargs(self))


#: The batch stats whose mean over a method's batches its entry reports.
_MEAN_STATS = ("effective_rollouts", "max_rollout_share", "candidate_rollouts", "turns_per_rollout", "kl_per_token",
               "mean_staleness")


@dataclass
class _Track:
    """One method's sampler and running statistics."""

    sampler: Sampler
    used: set[str] = field(default_factory=set)
    used_valid: int = 0
    batches: int = 0
    rows: int = 0
    dead_rows: int = 0
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_MEAN_STATS, 0.0))  # over the batches
    ema: float | None = None
    trained_tokens: int = 0
    scored_selected: int = 0
    selected_per_rollout: Counter[str] = field(default_factory=Counter)
    cells: Counter[tuple[str, str]] = field(default_factory=Counter)
    series: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in SERIES_KEYS})


def resolve_source(source: str | os.PathLike | Iterable[LoggedTurn], updates: int | None, what: str,
                   reuse: bool = False) -> tuple[str | None, Any, int]:
    """(log name or None, the source, U ticks) of a replay source; an iterable becomes a list when U must be counted
    from it or ``reuse`` (read once per pass)."""
    log_name = None
    if isinstance(source, (str, os.PathLike)):
        log_name = str(source)
        if updates is None:
            updates = log_updates(source)
    elif reuse or updates is None:
        source = list(source)
        if updates is None:
            updates = max((t.arrival_update for t in source), default=-1) + 1
    if updates < 1:
        raise ValueError(f"{what}: the log is empty and no --updates was given")
    return log_name, source, updates


#: The per-tick series taken from a batch's stats (None on a tick without a batch).
_BATCH_SERIES = ("effective_rollouts", "max_rollout_share", "dead_rows", "distinct_rollouts", "candidate_rollouts",
                 "mean_staleness", "turns_per_rollout", "kl_per_token")
_INT_SERIES = ("dead_rows", "distinct_rollouts", "candidate_rollouts")


def _step(tr: _Track, turns: list[Turn], j: int, valid: set[str]) -> None:
    """Deliver ``turns`` to one method, ask it for a batch at learner version ``j`` and record the tick."""
    tr.sampler.add(turns)
    batch = tr.sampler.next_batch(j)
    s = tr.series
    if batch is None:
        s["batch"].append(0)
        for key in _BATCH_SERIES:
            s[key].append(None)
    else:
        st = batch.stats
        tr.batches += 1
        tr.rows += int(st["rows"])
        tr.dead_rows += int(st["dead_rows"])
        for key in _MEAN_STATS:
            tr.sums[key] += float(st[key])
        tr.ema = pd.ema_update(tr.ema, float(st["disagreement_std_across_rollouts"]))
        tr.trained_tokens += int(st["response_tokens"])
        tr.cells.update(pd.rollout_cells(batch.payloads))
        for turn in batch.payloads:
            rid = turn.rollout_id
            tr.selected_per_rollout[rid] += 1
            tr.scored_selected += pd.scored_tokens(turn)
            if rid not in tr.used:
                tr.used.add(rid)
                tr.used_valid += rid in valid
        s["batch"].append(1)
        for key in _BATCH_SERIES:
            s[key].append(int(st[key]) if key in _INT_SERIES else float(st[key]))
    s["disagreement_std_ema"].append(tr.ema)
    ledger = tr.sampler.ledger
    for key in ("selected", "expired", "invalid"):
        s[key].append(getattr(ledger, key))
    s["waiting"].append(ledger.pending + ledger.queued)
    s["used_rollouts"].append(tr.used_valid)


def _method_result(tr: _Track, updates: int, valid: set[str], scored: int,
                   outcomes: dict[str, bool]) -> dict[str, Any]:
    """One method's entry of the result: :data:`RESULT_KEYS`, :data:`TABLE_KEYS`, then ``series`` and ``ledger``."""
    ledger = tr.sampler.ledger
    cells = pd.outcome_cells(tr.cells, outcomes)
    coverage = rollout_coverage(valid, tr.used, waiting_rollouts(tr.sampler))
    means = {key: divide(total, tr.batches) for key, total in tr.sums.items()}
    result = {
        "updates": tr.batches,
        "starved": updates - tr.batches,
        **coverage,
        "effective_rollouts_mean": means["effective_rollouts"],
        "max_rollout_share_mean": means["max_rollout_share"],
        "candidate_rollouts_mean": means["candidate_rollouts"],
        "dead_row_fraction": divide(tr.dead_rows, tr.rows),
        "selected": ledger.selected,
        "expired": ledger.expired,
        "invalid": ledger.invalid,
    }
    table = {
        "never_selected_share": coverage["unused_fraction"],
        "selection_gini": pd.gini(tr.selected_per_rollout.get(r, 0) for r in valid),
        "turns_per_rollout_mean": means["turns_per_rollout"],
        "kl_per_token_mean": means["kl_per_token"],
        "mean_age": means["mean_staleness"],
        "disagreement_std_ema": tr.ema,
        "teacher_tokens_per_trained_token": pd.teacher_tokens_per_trained_token(scored, tr.trained_tokens),
        "never_selected_scored_share": pd.never_selected_scored_share(scored, tr.scored_selected),
        "selected_by_cell": cell_counts(cells),
        "selection_chain": pd.cell_shares(cells),
    }
    return ({k: result[k] for k in RESULT_KEYS} | {k: table[k] for k in TABLE_KEYS}
            | {"series": tr.series, "ledger": asdict(ledger)})


def replay(source: str | os.PathLike | Iterable[LoggedTurn], config: ReplayConfig) -> dict[str, Any]:
    """Replay ``config.methods`` side by side over one log (a path, or an iterable of :class:`LoggedTurn`); returns
    the JSON-able result whose keys docs/guides/replay.md lists (per method: :data:`RESULT_KEYS`, :data:`TABLE_KEYS`,
    ``series`` of :data:`SERIES_KEYS` and the sampler's final ``ledger``)."""
    log_name, source, updates = resolve_source(source, config.updates, "replay")
    stream: Iterable[LoggedTurn] = read_log(source) if log_name is not None else source
    tracks = {m: _Track(make_sampler(config.sampler_config(m))) for m in config.methods}
    delivered_rollouts: set[str] = set()
    valid: set[str] = set()
    delivered = 0
    scored = 0
    delivered_cells: Counter[tuple[str, str]] = Counter()  # (depth bucket, rollout id)
    outcomes: dict[str, bool] = {}  # rollout id -> success, from any of its turns that carries it
    top_series: dict[str, list[int]] = {"delivered_turns": [], "valid_rollouts": []}

    for j, arrivals in deliveries(stream, updates):
        # 1. Deliver: the same turns, in arrival order, to every method.
        turns = [a.turn for a in arrivals]
        delivered += len(turns)
        delivered_cells.update(pd.rollout_cells(turns))
        for turn in turns:
            if turn.info.get("success") is not None:
                outcomes[turn.rollout_id] = bool(turn.info["success"])
            scored += pd.scored_tokens(turn)
            rid = turn.rollout_id
            delivered_rollouts.add(rid)
            if rid not in valid and gate.check(turn) is None:
                valid.add(rid)
                for tr in tracks.values():  # a rollout used earlier (vanilla: a dead row) now counts as valid used
                    tr.used_valid += rid in tr.used
        # 2. Ask each method for a batch at learner version j.
        for tr in tracks.values():
            _step(tr, turns, j, valid)
        top_series["delivered_turns"].append(delivered)
        top_series["valid_rollouts"].append(len(valid))

    delivered_cells = pd.outcome_cells(delivered_cells, outcomes)
    return {
        "log": log_name,
        "config": asdict(config) | {"methods": list(config.methods), "updates": updates},
        "updates": updates,
        "delivered_turns": delivered,
        "delivered_rollouts": len(delivered_rollouts),
        "arrival_drain_ratio": delivered / (updates * config.batch_size),
        "scored_tokens": scored,
        "delivered_by_cell": cell_counts(delivered_cells),
        "delivered_chain": pd.cell_shares(delivered_cells),
        "series": top_series,
        "methods": {name: _method_result(tr, updates, valid, scored, outcomes) for name, tr in tracks.items()},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", help="experience log: a .parquet file or a directory of part-*.parquet files")
    parser.add_argument(
        "--methods", default=None,
        help=f"comma-separated sampler methods (default {','.join(DEFAULT_METHODS)}, or with --selection-chain "
        f"{','.join(CHAIN_METHODS)}; known: {', '.join(METHODS)})",
    )
    add_sampler_flags(parser, defaults={"batch_size": 256})  # generated from divopd.sampling.settings
    parser.add_argument("--updates", type=int, default=None, help="U ticks (default: through the last arrival_update)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--json", dest="json_out", default=None, help="write results (with per-update series) here")
    parser.add_argument("--plot", default=None, help="write a PNG of the per-update series here")
    parser.add_argument(
        "--selection-chain", nargs="?", const="", default=None, metavar="MD",
        help="Table 14: print where each rule's selected turns come from (turn depth × rollout outcome), replaying "
        f"{','.join(CHAIN_METHODS)} (vanilla, +gate, +coverage, +focus) unless --methods is given; with a path, also "
        "write the table there as Markdown",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from divopd.errors import UsageError

    console = Console(width=None if Console().is_terminal else 160)
    chain = getattr(args, "selection_chain", None)
    default = CHAIN_METHODS if chain is not None else DEFAULT_METHODS
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else list(default)
    try:
        config = ReplayConfig(methods=methods, updates=args.updates, seed=args.seed, **settings_from_args(args))
        result = replay(args.log, config)
    except ValueError as exc:  # the options, or the log (an ExperienceLogError): one line, exit 2 (divopd.cli)
        if isinstance(exc, UsageError):
            raise
        raise UsageError(str(exc)) from exc
    console.print(render_table(result))
    console.print(render_diagnostics(result))
    console.print(f"delivered {result['delivered_turns']} turns of {result['delivered_rollouts']} rollouts over "
                  f"{result['updates']} updates; arrival/drain ratio {result['arrival_drain_ratio']:.2f}")
    if chain is not None:
        console.print(render_selection_chain(result))
        if chain:
            from divopd.analysis.replay_output import write_selection_chain

            write_selection_chain(result, chain)
            console.print(f"wrote {chain}")
    if args.json_out:
        write_json(result, args.json_out)
        console.print(f"wrote {args.json_out}")
    if args.plot:
        plot_replay(result, args.plot)
        console.print(f"wrote {args.plot}")
    return 0
