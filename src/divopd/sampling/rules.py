"""The paper's selection rules (Section 3 and Algorithm 1), one function each, over the pool's :class:`Columns`; a
rule returns pool positions in composition order."""

from __future__ import annotations

import math

import numpy as np

from divopd.sampling.candidate import Columns
from divopd.sampling.registry import Rule, RuleSettings

__all__ = ["is_stale", "pool_capacity", "pending_expiry", "visiting_order", "focus_order", "uniform_order",
           "allocate_rollout_first", "select_oldest", "select_top_b", "rollout_first"]


def is_stale(policy_version: int | np.ndarray, learner_version: int, max_staleness: int) -> bool | np.ndarray:
    """Staleness (Algorithm 1, step 1): a turn expires when ``learner_version − policy_version > max_staleness``."""
    return learner_version - policy_version > max_staleness


def pool_capacity(batch_size: int, pool_factor: float) -> int:
    """Candidate pool size ``c·B`` (rounded up; float noise such as 1.1 × 100 = 110.00000000000001 is ignored)."""
    return int(math.ceil(round(pool_factor * batch_size, 9)))


def pending_expiry(seen: np.ndarray, update: int, max_pending_age: int | None,
                   max_pending: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1, step 8, over the unselected pool in arrival order: the masks of the rows first seen more than W
    updates ago (``pending_age``) and, of the rest, the oldest beyond ``max_pending`` (``pending_overflow``)."""
    old = np.zeros(len(seen), dtype=bool) if max_pending_age is None else update - seen > max_pending_age
    overflow = np.zeros(len(seen), dtype=bool)
    if max_pending is not None:
        kept = np.flatnonzero(~old)
        overflow[kept[:max(0, len(kept) - max_pending)]] = True
    return old, overflow


def visiting_order(pool: Columns) -> np.ndarray:
    """Algorithm 1, step 4: the visiting ordinal of each row's rollout group, groups ordered by their oldest first-seen
    update, ties by rollout id."""
    ids, inverse = np.unique(pool.rollout_id, return_inverse=True)
    inverse = inverse.reshape(-1)
    oldest = np.full(len(ids), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(oldest, inverse, pool.seen)
    ordinal = np.empty(len(ids), dtype=np.intp)
    ordinal[np.argsort(oldest, kind="stable")] = np.arange(len(ids))
    return ordinal[inverse]


def focus_order(disagreement: np.ndarray, rollout: np.ndarray, turn_index: np.ndarray,
                group: np.ndarray | None = None) -> np.ndarray:
    """Focus (paper: "ranks its valid turns by the cached score over its valid tokens V_u, in descending order,
    breaking ties by (rid, t)"): positions by disagreement descending, ties by ``(rollout, turn_index)`` then
    position; inside each ``group`` (ascending) when given."""
    keys = (turn_index, rollout, -disagreement) + (() if group is None else (group,))
    return np.lexsort(keys)


def uniform_order(n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform within-rollout order (DivOPD-base): random sort keys, one draw per composition."""
    return rng.random(n)


def allocate_rollout_first(group: np.ndarray, batch_size: int, cap: int | None,
                           lengths: np.ndarray | None = None) -> np.ndarray:
    """Rollout-first allocation: positions into ``group`` of the turns the batch takes, in composition order.

    ``group`` is each turn's rollout group in visiting order, the turns sorted by (group, within-rollout rank). Pass
    j gives every group up to k + j turns; the batch takes the first B turns by (pass, group, rank); ``cap`` None:
    whole groups in visiting order. ``lengths`` (``cap_unit: tokens``, beyond the paper): the allowance counts
    response tokens, ``(cap + j) × mean length`` per group; the chosen turns are laid out as the turn cap lays them."""
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if cap is not None and cap < 1:
        raise ValueError(f"cap must be >= 1 or None, got {cap}")
    n = len(group)
    start = np.searchsorted(group, group, side="left")
    rank = np.arange(n) - start
    if cap is None:
        passes = np.zeros(n, dtype=np.int64)
    elif lengths is None:
        passes = np.maximum(rank - cap + 1, 0)
    else:
        passes = _token_passes(np.asarray(lengths, dtype=np.int64), start, cap)
    chosen = np.lexsort((group, passes))[:batch_size]
    if lengths is not None and cap is not None:
        chosen = chosen[np.lexsort((chosen, np.maximum(rank[chosen] - cap + 1, 0)))]
    return chosen


def _token_passes(lengths: np.ndarray, start: np.ndarray, cap: int) -> np.ndarray:
    """Per turn, the first pass p whose allowance ``(cap + p) × mean length`` holds its group's tokens up to it."""
    unit = max(int(lengths.sum()) / len(lengths), 1.0) if len(lengths) else 1.0
    total = np.cumsum(lengths)
    held = total - (total - lengths)[start]  # the group's tokens up to and including this turn
    passes = np.maximum(np.ceil(held / unit) - cap, 0).astype(np.int64)
    while (low := held > (cap + passes) * unit).any():
        passes[low] += 1
    while (high := (passes > 0) & (held <= (cap + passes - 1) * unit)).any():
        passes[high] -= 1
    return passes


def select_oldest(pool: Columns, batch_size: int, settings: RuleSettings, rng: np.random.Generator) -> np.ndarray:
    """``vanilla-pool``: the B oldest candidates by arrival."""
    return np.argsort(pool.arrival, kind="stable")[:batch_size]


def select_top_b(pool: Columns, batch_size: int, settings: RuleSettings, rng: np.random.Generator) -> np.ndarray:
    """``top-b`` (the paper's "Top-B (no rollout limit)"): the B best candidates in focus order (only those that can
    reach the top B, boundary ties included, are sorted)."""
    neg = -pool.disagreement
    rows = np.arange(len(pool))
    if len(pool) > 2 * batch_size:
        rows = np.flatnonzero(neg <= np.partition(neg, batch_size - 1)[batch_size - 1])
    order = focus_order(pool.disagreement[rows], pool.rollout_id[rows], pool.turn_index[rows])
    return rows[order[:batch_size]]


def rollout_first(within: str, capped: bool) -> Rule:
    """The rule of a rollout-first method: groups in visiting order, ``within`` each focus (``divopd``) or uniform
    order (``divopd-base``), allocated by :func:`allocate_rollout_first` with cap k (``capped``) or none (``nocap``)."""
    if within not in ("focus", "uniform"):
        raise ValueError(f"within-rollout order must be 'focus' or 'uniform', got {within!r}")

    def select(pool: Columns, batch_size: int, settings: RuleSettings, rng: np.random.Generator) -> np.ndarray:
        group = visiting_order(pool)
        if within == "focus":
            order = focus_order(pool.disagreement, group, pool.turn_index, group)
        else:  # one key per turn, drawn in visiting order
            keys = np.empty(len(pool))
            keys[np.argsort(group, kind="stable")] = uniform_order(len(pool), rng)
            order = np.lexsort((keys, group))
        lengths = pool.response_len[order] if settings.cap_unit == "tokens" else None
        return order[allocate_rollout_first(group[order], batch_size, settings.cap if capped else None, lengths)]

    select.__name__ = f"rollout_first_{within}_{'cap' if capped else 'nocap'}"
    return select
