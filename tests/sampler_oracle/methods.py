"""The batch composers and selectors of the built-in sampler rules (their records: :mod:`divopd.sampling.rows`).

A composer picks ``batch_size`` entries from a candidate pool of valid, non-stale turns and returns them in
composition order. The pool is given in *visiting order* (Algorithm 1, step 4): rollout groups by their oldest
first-seen update, ties by rollout id, arrival order inside a group (``group_order: arrival``: plain arrival
order), so that a group's first appearance is its turn to be visited. An entry is an ``(arrival, Turn)`` pair; a rule
that needs age uses the arrival number, not the list position. A rule is plugged in by its record
(:mod:`divopd.sampling.rows`, or :func:`register_method` for a tag-less one); it then works everywhere a method name is
accepted (configs, ``divopd replay``, ``divopd train``).

The built-in rules also have a *selector*: the same rule over :class:`PoolColumns`, numpy arrays of the per-turn
scalars the rule reads, which the sampler keeps alongside its pool. The sampler uses the selector when there is one
(it returns pool positions; it never has to visit every turn object of a large pool); the composer and the selector
of a rule return the same batch, which the tests check.

Methods (paper, Sections 3–4):

==============  ===========================================================================================
``vanilla``     arrival-order reader over the raw queue: no pool, no gate (see ``Sampler``)
``vanilla-pool``  same pool and gate as DivOPD, then the B oldest turns by arrival
``nocap``       pool + gate + rollout-first with k = ∞, uniform within-rollout order
``divopd-base`` pool + gate + rollout-first with cap k, uniform within-rollout order
``divopd``      pool + gate + rollout-first with cap k, focus order
``top-b``       pool + gate + Top-B: all valid candidates ranked by disagreement, no per-rollout limit
``divopd-focus``  the earlier composer (Appendix A.1): pool, **no gate**, task groups in seeded random order, 3-turn
                and 25% token-share first pass, task-balance row weights (:mod:`divopd.sampling.focus`)
==============  ===========================================================================================

A method may skip the gate (``gated=False``: invalid turns become candidates and, when selected, dead rows) and may
give per-row loss weights (``row_weights``: the sampler puts them on ``Batch.row_weights``; ``None`` = unit weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from divopd.experience.turn import Turn
from sampler_oracle.config import SamplerConfig
from sampler_oracle.registry import (
    METHODS,
    Composer,
    Entry,
    Method,
    Selector,
    get_method,
    register_method,
)
from sampler_oracle.rules import (
    allocate_rollout_first,
    allocate_rollout_first_array,
    allocate_rollout_first_tokens,
    focus_key,
    uniform_order,
)


@dataclass(frozen=True)
class PoolColumns:
    """Per-turn scalars of a candidate pool as numpy arrays, aligned with the pool's entries.

    Attributes:
        arrival: the sampler's arrival number of each turn (int64).
        version: generating policy version (int64).
        group: an int code of the rollout id (equal codes = same rollout; codes carry no order).
        neg_score: minus the cached disagreement (float64), so that ascending = focus order.
        turn_index: the turn index (int64).
    """

    arrival: np.ndarray
    version: np.ndarray
    group: np.ndarray
    neg_score: np.ndarray
    turn_index: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, int, float, int]]) -> PoolColumns:
        """From ``(arrival, version, group, neg_score, turn_index)`` rows."""
        if not rows:
            return cls.empty()
        arrival, version, group, neg_score, turn_index = zip(*rows, strict=True)
        return cls(
            np.array(arrival, dtype=np.int64),
            np.array(version, dtype=np.int64),
            np.array(group, dtype=np.int64),
            np.array(neg_score, dtype=np.float64),
            np.array(turn_index, dtype=np.int64),
        )

    @classmethod
    def empty(cls) -> PoolColumns:
        i64 = np.zeros(0, dtype=np.int64)
        return cls(i64, i64, i64, np.zeros(0, dtype=np.float64), i64)

    def take(self, index: np.ndarray | slice) -> PoolColumns:
        return PoolColumns(
            self.arrival[index], self.version[index], self.group[index], self.neg_score[index], self.turn_index[index]
        )

    def concat(self, other: PoolColumns) -> PoolColumns:
        if len(other) == 0:
            return self
        return PoolColumns(
            np.concatenate([self.arrival, other.arrival]),
            np.concatenate([self.version, other.version]),
            np.concatenate([self.group, other.group]),
            np.concatenate([self.neg_score, other.neg_score]),
            np.concatenate([self.turn_index, other.turn_index]),
        )


__all__ = ["Method", "METHODS", "PoolColumns", "register_method", "get_method", "compose_rollout_first",
           "compose_oldest", "compose_focus_first", "select_oldest", "select_focus_first", "select_rollout_first",
           "rollout_first", "rollout_first_select", "Entry", "Composer"]


# ---------------------------------------------------------------------------------------------------- composers
def compose_oldest(pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> list[Entry]:
    """``vanilla-pool``: the B oldest candidates by arrival."""
    return sorted(pool, key=itemgetter(0))[:batch_size]


def compose_focus_first(
    pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator
) -> list[Entry]:
    """``top-b`` (the paper's "Top-B (no rollout limit)"): all candidates ranked by disagreement, descending, ties by
    (rollout_id, turn_index).

    Only the B best are needed: a partial partition on the score keeps every candidate that can reach the top B
    (ties at the boundary included), and only those are sorted by the full key, so the result equals a full sort.
    """
    n = len(pool)
    if batch_size <= 0:
        return []
    if n > 2 * batch_size:
        neg = np.fromiter((-t.disagreement for _, t in pool), dtype=np.float64, count=n)
        bound = np.partition(neg, batch_size - 1)[batch_size - 1]
        pool = [pool[i] for i in np.flatnonzero(neg <= bound).tolist()]
    return sorted(pool, key=lambda e: focus_key(e[1]))[:batch_size]


def compose_rollout_first(
    pool: list[Entry],
    batch_size: int,
    cap: int | None,
    within: str,
    rng: np.random.Generator,
    cap_unit: str = "turns",
) -> list[Entry]:
    """Rollout-first composition: group by rollout, visit longest-waiting groups first, cap k on the first pass.

    Args:
        pool: candidates in visiting order: rollout groups by their oldest first-seen update, arrival order inside a
            group, so a group's first appearance is its turn to be visited.
        batch_size: B.
        cap: first-pass cap k (``None`` = no cap).
        within: within-rollout order, ``"focus"`` or ``"uniform"``.
        rng: draws the uniform order (one permutation of the pool per composition).
        cap_unit: ``"turns"`` (the paper) or ``"tokens"`` (token-share cap).

    Returns:
        The selected entries in composition order: by pass, then group visiting order, then within-rollout rank.
    """
    if within not in ("focus", "uniform"):
        raise ValueError(f"within-rollout order must be 'focus' or 'uniform', got {within!r}")
    # 1. Group by rollout. The pool is in visiting order, so first appearance = the group's turn: insertion order is
    #    "longest-waiting first" (Algorithm 1: by first-seen update, then rollout id). A member is its pool
    #    index; for focus it is decorated as (−disagreement, turn_index, index), so that a plain sort of the group
    #    is focus order (the rollout id is shared inside a group) with ties kept in pool order.
    index_of: dict[str, int] = {}
    members: list[list] = []
    focus = within == "focus"
    for i, (_, turn) in enumerate(pool):
        member = (-turn.disagreement, turn.turn_index, i) if focus else i
        g = index_of.get(turn.rollout_id)
        if g is None:
            index_of[turn.rollout_id] = len(members)
            members.append([member])
        else:
            members[g].append(member)
    # 2. Within-rollout order: focus (above) or uniform, one random key per pool turn drawn once per composition.
    if focus:

        def rank(m: list) -> list[int]:
            return [i for _, _, i in (sorted(m) if len(m) > 1 else m)]

    else:
        key = uniform_order(len(pool), rng).tolist().__getitem__

        def rank(m: list) -> list[int]:
            return sorted(m, key=key) if len(m) > 1 else m

    # 3. Allocate slots per rollout. The turn cap needs only the group sizes, so only groups that receive slots are
    #    ordered; the token cap needs every group's order first.
    if cap_unit == "tokens":
        ranked = [rank(m) for m in members]
        alloc = allocate_rollout_first_tokens([[pool[i][1].response_len for i in m] for m in ranked], batch_size, cap)
    else:
        alloc = allocate_rollout_first([len(m) for m in members], batch_size, cap)
        ranked = [rank(m) if a else [] for m, a in zip(members, alloc, strict=True)]
    # 4. Lay the slots out pass by pass: pass 0 holds ranks 0..k-1 of every group (visiting order), pass j >= 1 holds
    #    rank k-1+j of every group allocated more than k-1+j slots.
    out: list[Entry] = []
    deeper: list[int] = []
    for g, a in enumerate(alloc):
        if a:
            head = a if cap is None else min(a, cap)
            out.extend(pool[i] for i in ranked[g][:head])
            if head < a:
                deeper.append(g)
    r = cap if cap is not None else 0
    while deeper:
        out.extend(pool[ranked[g][r]] for g in deeper)
        r += 1
        deeper = [g for g in deeper if alloc[g] > r]
    return out


def rollout_first(within: str, capped: bool) -> Composer:
    """The composer of a rollout-first rule: ``within`` order (focus / uniform), capped at ``config.cap`` or not."""
    def compose(pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> list[Entry]:
        cap = config.cap if capped else None
        return compose_rollout_first(pool, batch_size, cap, within, rng, config.cap_unit)

    compose.__name__ = f"compose_rollout_first_{within}_{'cap' if capped else 'nocap'}"
    return compose


# ---------------------------------------------------------------------------------------------------- selectors
def select_oldest(
    pool: dict[int, Turn], cols: PoolColumns, batch_size: int, config: SamplerConfig, rng: np.random.Generator
) -> np.ndarray:
    """``vanilla-pool`` over columns: positions of the B oldest candidates by arrival."""
    return np.argsort(cols.arrival, kind="stable")[:batch_size]


def select_focus_first(
    pool: dict[int, Turn], cols: PoolColumns, batch_size: int, config: SamplerConfig, rng: np.random.Generator
) -> np.ndarray:
    """``top-b`` over columns: partition on the score, then the full key on the few that can make the top B."""
    neg = cols.neg_score
    n = len(cols)
    if n > 2 * batch_size:
        candidates = np.flatnonzero(neg <= np.partition(neg, batch_size - 1)[batch_size - 1])
    else:
        candidates = np.arange(n)
    turns = [pool[a] for a in cols.arrival[candidates].tolist()]
    keyed = sorted(
        (score, t.rollout_id, t.turn_index, i)
        for score, t, i in zip(neg[candidates].tolist(), turns, candidates.tolist(), strict=True)
    )
    return np.array([k[3] for k in keyed[:batch_size]], dtype=np.intp)


def select_rollout_first(
    cols: PoolColumns, batch_size: int, cap: int | None, within: str, rng: np.random.Generator
) -> np.ndarray:
    """:func:`compose_rollout_first` (turn cap) over columns; returns pool positions in composition order.

    Groups get visiting ordinals by first appearance (oldest arrival); one stable ``lexsort`` ranks every group
    (focus: score, then turn index; uniform: the composition's random keys); the closed-form allocation gives each
    group's slots; a group's first ``alloc`` ranked turns are taken and laid out by (pass, group, rank).
    """
    n = len(cols)
    _, first, inverse = np.unique(cols.group, return_index=True, return_inverse=True)
    visit = np.empty(len(first), dtype=np.intp)
    visit[np.argsort(first)] = np.arange(len(first))
    group = visit[inverse.reshape(-1)]  # visiting ordinal of each pool turn
    if within == "focus":
        order = np.lexsort((cols.turn_index, cols.neg_score, group))
    elif within == "uniform":
        order = np.lexsort((uniform_order(n, rng), group))
    else:
        raise ValueError(f"within-rollout order must be 'focus' or 'uniform', got {within!r}")
    sizes = np.bincount(group, minlength=len(first))
    alloc = allocate_rollout_first_array(sizes, batch_size, cap)
    group_sorted = group[order]
    rank = np.arange(n) - (np.cumsum(sizes) - sizes)[group_sorted]
    take = rank < alloc[group_sorted]
    positions = order[take]
    if cap is not None:
        rank = rank[take]
        positions = positions[np.lexsort((rank, group_sorted[take], np.maximum(rank - cap + 1, 0)))]
    return positions


def rollout_first_select(within: str, capped: bool) -> Selector:
    """:func:`rollout_first` over :class:`PoolColumns` (the token cap runs on the entries)."""
    def select(
        pool: dict[int, Turn], cols: PoolColumns, batch_size: int, config: SamplerConfig, rng: np.random.Generator
    ) -> np.ndarray:
        cap = config.cap if capped else None
        if config.cap_unit != "turns":  # the token cap (beyond the paper) runs on the entries
            entries = [(a, pool[a]) for a in cols.arrival.tolist()]  # in the columns' (visiting) order
            where = {arrival: i for i, (arrival, _) in enumerate(entries)}
            selected = compose_rollout_first(entries, batch_size, cap, within, rng, config.cap_unit)
            return np.array([where[arrival] for arrival, _ in selected], dtype=np.intp)
        return select_rollout_first(cols, batch_size, cap, within, rng)

    return select
