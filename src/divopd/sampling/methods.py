"""Batch composers, registered by method name.

A composer picks ``batch_size`` entries from a candidate pool of valid, non-stale turns and returns them in
composition order. The pool is given in arrival order (pending turns first, then fresh ones, all oldest first). An
entry is an ``(arrival, Turn)`` pair. Register a new rule with :func:`register_method`; it then works everywhere a
method name is accepted (configs, ``divopd replay``, ``divopd train``).

Methods (paper, Sections 3–4):

==============  ===========================================================================================
``vanilla``     arrival-order reader over the raw queue: no pool, no gate (see ``Sampler``)
``vanilla-pool``  same pool and gate as DivOPD, then the B oldest turns by arrival
``nocap``       pool + gate + rollout-first with k = ∞, uniform within-rollout order
``divopd-base`` pool + gate + rollout-first with cap k, uniform within-rollout order
``divopd``      pool + gate + rollout-first with cap k, focus order
``divopd-focus``  pool + gate + global focus-first: all candidates ranked by disagreement
==============  ===========================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from divopd.experience import Turn
from divopd.sampling.rules import (
    allocate_rollout_first,
    allocate_rollout_first_tokens,
    focus_key,
    uniform_order,
)

if TYPE_CHECKING:
    from divopd.sampling.sampler import SamplerConfig

Entry = tuple[int, Turn]
Composer = Callable[[list[Entry], int, "SamplerConfig", np.random.Generator], list[Entry]]

__all__ = ["Method", "METHODS", "register_method", "get_method", "compose_rollout_first"]


@dataclass(frozen=True)
class Method:
    """A batch-selection method.

    Attributes:
        name: the registry name (``SamplerConfig.method``).
        compose: the composer; ``None`` for the arrival-order reader, which reads the raw queue.
        pooled: True when the method reads a gated candidate pool of ``pool_factor × batch_size`` turns.
        description: one line for ``--help`` and the README.
    """

    name: str
    compose: Composer | None
    pooled: bool
    description: str


METHODS: dict[str, Method] = {}


def register_method(name: str, compose: Composer, description: str = "") -> Method:
    """Register a pooled composer under ``name`` (the extension point for new selection rules, e.g. TurnOPD)."""
    if not name or not isinstance(name, str):
        raise ValueError("method name must be a non-empty str")
    if name in METHODS:
        raise ValueError(f"method {name!r} is already registered")
    method = Method(name=name, compose=compose, pooled=True, description=description)
    METHODS[name] = method
    return method


def get_method(name: str) -> Method:
    """The registered method called ``name``; ``ValueError`` naming the known methods otherwise."""
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"unknown sampler method {name!r}; known: {', '.join(sorted(METHODS))}")
    return method


# ---------------------------------------------------------------------------------------------------- composers
def compose_oldest(pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> list[Entry]:
    """``vanilla-pool``: the B oldest candidates by arrival."""
    return sorted(pool, key=itemgetter(0))[:batch_size]


def compose_focus_first(
    pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator
) -> list[Entry]:
    """``divopd-focus``: all candidates ranked by disagreement, descending, ties by (rollout_id, turn_index).

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
        pool: candidates in arrival order.
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
    # 1. Group by rollout. The pool is in arrival order, so first appearance = the group's oldest arrival: insertion
    #    order is "longest-waiting first" (arrivals are unique, so no ties remain to break). A member is its pool
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


def _rollout_first(within: str, capped: bool) -> Composer:
    def compose(pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> list[Entry]:
        cap = config.cap if capped else None
        return compose_rollout_first(pool, batch_size, cap, within, rng, config.cap_unit)

    compose.__name__ = f"compose_rollout_first_{within}_{'cap' if capped else 'nocap'}"
    return compose


METHODS["vanilla"] = Method("vanilla", None, False, "arrival-order reader: next B non-stale turns, no gate")
register_method("vanilla-pool", compose_oldest, "pool + gate, then the B oldest turns by arrival")
register_method("nocap", _rollout_first("uniform", capped=False), "pool + gate + rollout-first, k=∞, uniform within")
register_method(
    "divopd-base", _rollout_first("uniform", capped=True), "pool + gate + rollout-first cap k, uniform within"
)
register_method("divopd", _rollout_first("focus", capped=True), "pool + gate + rollout-first cap k, focus within")
register_method("divopd-focus", compose_focus_first, "pool + gate + global focus-first ranking")
