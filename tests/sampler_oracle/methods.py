# ruff: noqa
"""The previous sampler's methods module, kept as the test oracle (docstrings dropped)."""
from __future__ import annotations
from dataclasses import dataclass
from operator import itemgetter
import numpy as np
from divopd.experience.turn import Turn
from divopd.sampling.config import SamplerConfig
from sampler_oracle.registry import METHODS, Composer, Entry, Method, Selector, get_method
from sampler_oracle.rules import allocate_rollout_first, allocate_rollout_first_array, allocate_rollout_first_tokens, focus_key, uniform_order

@dataclass(frozen=True)
class PoolColumns:
    arrival: np.ndarray
    version: np.ndarray
    group: np.ndarray
    neg_score: np.ndarray
    turn_index: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, int, float, int]]) -> PoolColumns:
        if not rows:
            return cls.empty()
        arrival, version, group, neg_score, turn_index = zip(*rows, strict=True)
        return cls(np.array(arrival, dtype=np.int64), np.array(version, dtype=np.int64), np.array(group, dtype=np.int64), np.array(neg_score, dtype=np.float64), np.array(turn_index, dtype=np.int64))

    @classmethod
    def empty(cls) -> PoolColumns:
        i64 = np.zeros(0, dtype=np.int64)
        return cls(i64, i64, i64, np.zeros(0, dtype=np.float64), i64)

    def take(self, index: np.ndarray | slice) -> PoolColumns:
        return PoolColumns(self.arrival[index], self.version[index], self.group[index], self.neg_score[index], self.turn_index[index])

    def concat(self, other: PoolColumns) -> PoolColumns:
        if len(other) == 0:
            return self
        return PoolColumns(np.concatenate([self.arrival, other.arrival]), np.concatenate([self.version, other.version]), np.concatenate([self.group, other.group]), np.concatenate([self.neg_score, other.neg_score]), np.concatenate([self.turn_index, other.turn_index]))

def compose_oldest(pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> list[Entry]:
    return sorted(pool, key=itemgetter(0))[:batch_size]

def compose_focus_first(pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> list[Entry]:
    n = len(pool)
    if batch_size <= 0:
        return []
    if n > 2 * batch_size:
        neg = np.fromiter((-t.disagreement for _, t in pool), dtype=np.float64, count=n)
        bound = np.partition(neg, batch_size - 1)[batch_size - 1]
        pool = [pool[i] for i in np.flatnonzero(neg <= bound).tolist()]
    return sorted(pool, key=lambda e: focus_key(e[1]))[:batch_size]

def compose_rollout_first(pool: list[Entry], batch_size: int, cap: int | None, within: str, rng: np.random.Generator, cap_unit: str='turns') -> list[Entry]:
    if within not in ('focus', 'uniform'):
        raise ValueError(f"within-rollout order must be 'focus' or 'uniform', got {within!r}")
    index_of: dict[str, int] = {}
    members: list[list] = []
    focus = within == 'focus'
    for i, (_, turn) in enumerate(pool):
        member = (-turn.disagreement, turn.turn_index, i) if focus else i
        g = index_of.get(turn.rollout_id)
        if g is None:
            index_of[turn.rollout_id] = len(members)
            members.append([member])
        else:
            members[g].append(member)
    if focus:

        def rank(m: list) -> list[int]:
            return [i for _, _, i in (sorted(m) if len(m) > 1 else m)]
    else:
        key = uniform_order(len(pool), rng).tolist().__getitem__

        def rank(m: list) -> list[int]:
            return sorted(m, key=key) if len(m) > 1 else m
    if cap_unit == 'tokens':
        ranked = [rank(m) for m in members]
        alloc = allocate_rollout_first_tokens([[pool[i][1].response_len for i in m] for m in ranked], batch_size, cap)
    else:
        alloc = allocate_rollout_first([len(m) for m in members], batch_size, cap)
        ranked = [rank(m) if a else [] for m, a in zip(members, alloc, strict=True)]
    out: list[Entry] = []
    deeper: list[int] = []
    for g, a in enumerate(alloc):
        if a:
            head = a if cap is None else min(a, cap)
            out.extend((pool[i] for i in ranked[g][:head]))
            if head < a:
                deeper.append(g)
    r = cap if cap is not None else 0
    while deeper:
        out.extend((pool[ranked[g][r]] for g in deeper))
        r += 1
        deeper = [g for g in deeper if alloc[g] > r]
    return out

def rollout_first(within: str, capped: bool) -> Composer:

    def compose(pool: list[Entry], batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> list[Entry]:
        cap = config.cap if capped else None
        return compose_rollout_first(pool, batch_size, cap, within, rng, config.cap_unit)
    compose.__name__ = f"compose_rollout_first_{within}_{('cap' if capped else 'nocap')}"
    return compose

def select_oldest(pool: dict[int, Turn], cols: PoolColumns, batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> np.ndarray:
    return np.argsort(cols.arrival, kind='stable')[:batch_size]

def select_focus_first(pool: dict[int, Turn], cols: PoolColumns, batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> np.ndarray:
    neg = cols.neg_score
    n = len(cols)
    if n > 2 * batch_size:
        candidates = np.flatnonzero(neg <= np.partition(neg, batch_size - 1)[batch_size - 1])
    else:
        candidates = np.arange(n)
    turns = [pool[a] for a in cols.arrival[candidates].tolist()]
    keyed = sorted(((score, t.rollout_id, t.turn_index, i) for score, t, i in zip(neg[candidates].tolist(), turns, candidates.tolist(), strict=True)))
    return np.array([k[3] for k in keyed[:batch_size]], dtype=np.intp)

def select_rollout_first(cols: PoolColumns, batch_size: int, cap: int | None, within: str, rng: np.random.Generator) -> np.ndarray:
    n = len(cols)
    _, first, inverse = np.unique(cols.group, return_index=True, return_inverse=True)
    visit = np.empty(len(first), dtype=np.intp)
    visit[np.argsort(first)] = np.arange(len(first))
    group = visit[inverse.reshape(-1)]
    if within == 'focus':
        order = np.lexsort((cols.turn_index, cols.neg_score, group))
    elif within == 'uniform':
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

    def select(pool: dict[int, Turn], cols: PoolColumns, batch_size: int, config: SamplerConfig, rng: np.random.Generator) -> np.ndarray:
        cap = config.cap if capped else None
        if config.cap_unit != 'turns':
            entries = [(a, pool[a]) for a in cols.arrival.tolist()]
            where = {arrival: i for i, (arrival, _) in enumerate(entries)}
            selected = compose_rollout_first(entries, batch_size, cap, within, rng, config.cap_unit)
            return np.array([where[arrival] for arrival, _ in selected], dtype=np.intp)
        return select_rollout_first(cols, batch_size, cap, within, rng)
    return select
