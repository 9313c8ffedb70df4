# ruff: noqa
"""The previous sampler's rules module, kept as the test oracle (docstrings dropped)."""
from __future__ import annotations
import math
from collections.abc import Sequence
import numpy as np
from divopd.experience.turn import Turn

def is_stale(policy_version: int, learner_version: int, max_staleness: int) -> bool:
    return learner_version - policy_version > max_staleness

def allocate_rollout_first(group_sizes: Sequence[int], batch_size: int, cap: int | None) -> list[int]:
    if batch_size < 0:
        raise ValueError(f'batch_size must be >= 0, got {batch_size}')
    if cap is not None and cap < 1:
        raise ValueError(f'cap must be >= 1 or None, got {cap}')
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
        limit += 1
    return alloc

def allocate_rollout_first_array(group_sizes: Sequence[int] | np.ndarray, batch_size: int, cap: int | None) -> np.ndarray:
    if batch_size < 0:
        raise ValueError(f'batch_size must be >= 0, got {batch_size}')
    if cap is not None and cap < 1:
        raise ValueError(f'cap must be >= 1 or None, got {cap}')
    sizes = np.asarray(group_sizes, dtype=np.int64)
    if int(sizes.sum()) <= batch_size:
        return sizes.copy()
    first = sizes if cap is None else np.minimum(sizes, cap)
    filled = np.cumsum(first)
    if filled[-1] >= batch_size:
        alloc = np.zeros_like(sizes)
        cut = int(np.searchsorted(filled, batch_size))
        alloc[:cut] = first[:cut]
        alloc[cut] = batch_size - (int(filled[cut - 1]) if cut else 0)
        return alloc
    lo, hi = (0, int(sizes.max()) - cap)
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

def allocate_rollout_first_tokens(group_token_lens: Sequence[Sequence[int]], batch_size: int, cap: int | None) -> list[int]:
    if cap is None:
        return allocate_rollout_first([len(g) for g in group_token_lens], batch_size, None)
    if cap < 1:
        raise ValueError(f'cap must be >= 1 or None, got {cap}')
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
            while remaining > 0 and alloc[g] < len(lens) and (used[g] + lens[alloc[g]] <= allowance):
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
    return 0 if cap is None else max(0, rank - cap + 1)

def focus_key(turn: Turn) -> tuple[float, str, int]:
    return (-turn.disagreement, turn.rollout_id, turn.turn_index)

def focus_order(turns: Sequence[Turn]) -> list[Turn]:
    return sorted(turns, key=focus_key)

def uniform_order(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.random(n)

def pool_capacity(batch_size: int, pool_factor: float) -> int:
    return int(math.ceil(round(pool_factor * batch_size, 9)))
