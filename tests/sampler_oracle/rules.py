"""The paper's selection rules, one named function each (Section 3, "coverage" and "focus").

These functions work on plain lists and ints so that they can be read, tested and reused on their own; the
:class:`~divopd.sampling.sampler.Sampler` wires them to the queue, the pool and the ledger.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from divopd.experience.turn import Turn

__all__ = [
    "is_stale",
    "allocate_rollout_first",
    "allocate_rollout_first_array",
    "allocate_rollout_first_tokens",
    "slot_pass",
    "focus_key",
    "focus_order",
    "uniform_order",
]


def is_stale(policy_version: int, learner_version: int, max_staleness: int) -> bool:
    """A turn is stale when ``learner_version − policy_version > max_staleness``; stale turns expire."""
    return learner_version - policy_version > max_staleness


def allocate_rollout_first(group_sizes: Sequence[int], batch_size: int, cap: int | None) -> list[int]:
    """Rollout-first allocation: how many slots each rollout group receives.

    Paper: "the composer groups valid turns by rollout ID and visits the longest-waiting groups first. On the first
    pass through these groups, each rollout contributes at most k turns […]. If the batch is not full, each additional
    pass raises the cap by one. Thus k limits the first pass, not the final number of turns per rollout."

    Args:
        group_sizes: number of candidate turns of each rollout, in visiting order (longest-waiting first).
        batch_size: B, the number of slots to fill.
        cap: k, the first-pass cap; ``None`` means no cap (k = ∞).

    Returns:
        Slots per group (same order). Their sum is ``min(batch_size, sum(group_sizes))``.
    """
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if cap is not None and cap < 1:
        raise ValueError(f"cap must be >= 1 or None, got {cap}")
    alloc = [0] * len(group_sizes)
    remaining = batch_size
    limit = max(group_sizes, default=0) if cap is None else cap
    open_groups = [g for g, size in enumerate(group_sizes) if size > 0]
    while remaining > 0 and open_groups:
        still_open = []
        for g in open_groups:
            if remaining == 0:
                break
            take = min(limit, group_sizes[g]) - alloc[g]
            if take > 0:
                take = min(take, remaining)
                alloc[g] += take
                remaining -= take
            if alloc[g] < group_sizes[g]:
                still_open.append(g)
        open_groups = still_open
        limit += 1  # pass j + 1 lets each rollout hold at most k + j + 1 turns
    return alloc


def allocate_rollout_first_array(
    group_sizes: Sequence[int] | np.ndarray, batch_size: int, cap: int | None
) -> np.ndarray:
    """:func:`allocate_rollout_first` in closed form over a numpy array (the same allocation, for large pools).

    After passes 0..j every rollout holds ``min(size, k + j)`` turns. If pass 0 already fills the batch, rollouts take
    ``min(size, k)`` in visiting order until B runs out. Otherwise find the last complete pass j (the largest j with
    ``Σ min(size, k + j) <= B``, by bisection) and give one more slot, in visiting order, to the first rollouts that
    still have turns, until the batch is full: that is the partial pass j + 1.
    """
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if cap is not None and cap < 1:
        raise ValueError(f"cap must be >= 1 or None, got {cap}")
    sizes = np.asarray(group_sizes, dtype=np.int64)
    if int(sizes.sum()) <= batch_size:
        return sizes.copy()
    first = sizes if cap is None else np.minimum(sizes, cap)
    filled = np.cumsum(first)
    if filled[-1] >= batch_size:  # the batch fills during pass 0 (always so without a cap)
        alloc = np.zeros_like(sizes)
        cut = int(np.searchsorted(filled, batch_size))  # first rollout at which the running total reaches B
        alloc[:cut] = first[:cut]
        alloc[cut] = batch_size - (int(filled[cut - 1]) if cut else 0)
        return alloc
    lo, hi = 0, int(sizes.max()) - cap  # Σ min(size, k + lo) < B  and  Σ min(size, k + hi) = Σ size > B
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if int(np.minimum(sizes, cap + mid).sum()) <= batch_size:
            lo = mid
        else:
            hi = mid
    alloc = np.minimum(sizes, cap + lo)
    short = batch_size - int(alloc.sum())
    if short:
        alloc[np.flatnonzero(sizes > cap + lo)[:short]] += 1
    return alloc


def allocate_rollout_first_tokens(
    group_token_lens: Sequence[Sequence[int]], batch_size: int, cap: int | None
) -> list[int]:
    """Rollout-first allocation with a token-share cap (``cap_unit: tokens``, beyond the paper).

    The paper's cap counts turns, "so it does not bound a rollout's token share when response lengths vary". Here the
    first-pass allowance of each rollout is ``cap / batch_size`` of the batch's token budget, the budget being
    ``batch_size × mean response length of the candidates`` (so the allowance is ``cap × mean length`` tokens, and
    equals the turn cap when all lengths are equal). A rollout takes its turns in within-rollout order while they fit
    in its allowance; each further pass raises the allowance by one mean length, exactly as the turn cap is raised by
    one turn. A single turn longer than the allowance waits for a later pass.

    Guarantee: after the first pass no rollout holds more than ``cap × mean length`` response tokens.

    Args:
        group_token_lens: per group (visiting order), the response lengths of its turns in within-rollout order.
        batch_size: B.
        cap: k; ``None`` means no cap.

    Returns:
        Slots per group: each group takes a prefix of its ordered turns.
    """
    if cap is None:
        return allocate_rollout_first([len(g) for g in group_token_lens], batch_size, None)
    if cap < 1:
        raise ValueError(f"cap must be >= 1 or None, got {cap}")
    all_lens = [n for g in group_token_lens for n in g]
    if not all_lens:
        return [0] * len(group_token_lens)
    unit = max(sum(all_lens) / len(all_lens), 1.0)
    alloc = [0] * len(group_token_lens)
    used = [0] * len(group_token_lens)
    remaining = batch_size
    passes = 0
    allowance = cap * unit
    open_groups = [g for g, lens in enumerate(group_token_lens) if lens]
    while remaining > 0 and open_groups:
        still_open = []
        for g in open_groups:
            lens = group_token_lens[g]
            while remaining > 0 and alloc[g] < len(lens) and used[g] + lens[alloc[g]] <= allowance:
                used[g] += lens[alloc[g]]
                alloc[g] += 1
                remaining -= 1
            if alloc[g] < len(lens):
                still_open.append(g)
            if remaining == 0:
                break
        open_groups = still_open
        passes += 1
        allowance = (cap + passes) * unit
    return alloc


def slot_pass(rank: int, cap: int | None) -> int:
    """The pass in which the turn of within-rollout ``rank`` (0-based) gets its slot under a turn cap ``k``."""
    return 0 if cap is None else max(0, rank - cap + 1)


def focus_key(turn: Turn) -> tuple[float, str, int]:
    """Sort key of focus: disagreement descending, ties by ``(rollout_id, turn_index)``."""
    return (-turn.disagreement, turn.rollout_id, turn.turn_index)


def focus_order(turns: Sequence[Turn]) -> list[Turn]:
    """Focus: rank turns by cached disagreement Σ_{i∈V_u}(log π_v(u) − log π_teacher), descending.

    Paper: "DivOPD ranks its valid turns by the cached score over its valid tokens V_u, in descending order, breaking
    ties by (rid, t), on every pass."
    """
    return sorted(turns, key=focus_key)


def uniform_order(n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform within-rollout order (DivOPD-base): random sort keys from one seeded permutation per composition."""
    return rng.random(n)


def pool_capacity(batch_size: int, pool_factor: float) -> int:
    """Candidate pool size ``c·B`` (rounded up; float noise such as 1.1 × 100 = 110.00000000000001 is ignored)."""
    return int(math.ceil(round(pool_factor * batch_size, 9)))
