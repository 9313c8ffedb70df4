# ruff: noqa
"""The previous sampler's sampler module, kept as the test oracle (docstrings dropped)."""
from __future__ import annotations
from types import SimpleNamespace
import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any
import numpy as np
import divopd.sampling.gate as gate
from divopd.experience.turn import Turn
from divopd.sampling.config import SamplerConfig
from sampler_oracle.methods import PoolColumns
from sampler_oracle.registry import Entry, get_method
from divopd.sampling.stats import BatchStats, batch_stats

class Batch(SimpleNamespace):
    """What the previous sampler returned: turns, arrivals, learner_version, stats, candidates, first_seen,
    row_weights."""

    def __len__(self) -> int:
        return len(self.turns)


class Sampler:

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config
        self.method = get_method(config.method)
        self._queue: OrderedDict[int, tuple[Turn, str | None, tuple]] = OrderedDict()
        self._expiry: list[tuple[int, int]] = []
        self._pending: dict[int, Turn] = {}
        self._seen: dict[int, int] = {}
        self._columns = PoolColumns.empty()
        self._codes: dict[str, int] = {}
        self._next_arrival = 0
        self._compositions = 0
        self._counts = {'received': 0, 'selected': 0, 'expired': 0, 'invalid': 0}
        self._invalid_by_reason: dict[str, int] = dict.fromkeys(gate.REASONS, 0)
        self._expired_by_reason: dict[str, int] = {'stale': 0, 'pending_age': 0, 'pending_overflow': 0}
        self.turn_from_dict: Callable[[dict[str, Any]], Turn] = Turn.from_dict

    def add(self, turns: Turn | Iterable[Turn]) -> list[int]:
        turns = [turns] if isinstance(turns, Turn) else list(turns)
        for turn in turns:
            if not isinstance(turn, Turn):
                raise TypeError(f'Sampler.add expects divopd.Turn objects, got {type(turn).__name__}')
        arrivals = []
        for turn in turns:
            arrival = self._next_arrival
            self._next_arrival += 1
            self._enqueue(arrival, turn)
            arrivals.append(arrival)
        self._counts['received'] += len(arrivals)
        return arrivals

    def _enqueue(self, arrival: int, turn: Turn) -> None:
        reason = gate.check(turn)
        if len(self._codes) > 4 * self.waiting + 4096:
            self._recode()
        row = self._row(arrival, turn)
        self._queue[arrival] = (turn, reason, row)
        heapq.heappush(self._expiry, (turn.policy_version, arrival))

    def _row(self, arrival: int, turn: Turn) -> tuple[int, int, int, float, int]:
        codes = self._codes
        code = codes.setdefault(turn.rollout_id, len(codes))
        return (arrival, turn.policy_version, code, -turn.disagreement, turn.turn_index)

    def _recode(self) -> None:
        self._codes = {}
        for arrival, (turn, reason, _) in list(self._queue.items()):
            self._queue[arrival] = (turn, reason, self._row(arrival, turn))
        self._columns = PoolColumns.from_rows([self._row(a, t) for a, t in self._pending.items()])

    def waiting_arrivals(self) -> set[int]:
        return set(self._queue) | set(self._pending)

    @property
    def ledger(self) -> dict[str, Any]:
        return {**self._counts, 'pending': len(self._pending), 'queued': len(self._queue), 'invalid_by_reason': dict(self._invalid_by_reason), 'expired_by_reason': dict(self._expired_by_reason)}

    @property
    def waiting(self) -> int:
        return len(self._pending) + len(self._queue)

    def next_batch(self, learner_version: int) -> Batch | None:
        if isinstance(learner_version, bool) or not isinstance(learner_version, (int, np.integer)):
            raise TypeError(f'learner_version must be an int, got {learner_version!r}')
        learner_version = int(learner_version)
        before_expired, before_invalid = (self._counts['expired'], self._counts['invalid'])
        self._expire_stale(learner_version)
        if self.method.pooled:
            selected, candidates, first_seen = self._compose_pooled(learner_version)
        else:
            selected = self._read_arrival_order()
            candidates, first_seen = (None, [])
        if selected is None:
            return None
        self._counts['selected'] += len(selected)
        turns = [t for _, t in selected]
        stats = batch_stats(turns, learner_version)
        stats.update(expired=self._counts['expired'] - before_expired, invalid=self._counts['invalid'] - before_invalid, pending=len(self._pending), queued=len(self._queue), candidates=len(candidates) if candidates is not None else len(turns), candidate_rollouts=len({t.rollout_id for t in (candidates if candidates is not None else turns)}))
        return Batch(turns=turns, arrivals=[a for a, _ in selected], learner_version=learner_version, stats=stats, candidates=candidates if candidates is not None else list(turns), first_seen=first_seen, row_weights=None if self.method.row_weights is None else self.method.row_weights(turns))

    def _expire_stale(self, learner_version: int) -> None:
        threshold = learner_version - self.config.max_staleness
        heap = self._expiry
        while heap and heap[0][0] < threshold:
            _, arrival = heapq.heappop(heap)
            if self._queue.pop(arrival, None) is not None:
                self._expire(1, 'stale')
        if len(heap) > 2 * len(self._queue) + 1024:
            self._expiry = [(t.policy_version, a) for a, (t, _, _) in self._queue.items()]
            heapq.heapify(self._expiry)
        if self._pending:
            stale = self._columns.version < threshold
            if stale.any():
                self._drop_pending(self._columns.arrival[stale])
                self._columns = self._columns.take(np.flatnonzero(~stale))
                self._expire(int(np.count_nonzero(stale)), 'stale')

    def _drop_pending(self, arrivals: np.ndarray) -> None:
        pending, seen = (self._pending, self._seen)
        for arrival in arrivals.tolist():
            del pending[arrival]
            del seen[arrival]

    def _expire(self, n: int, reason: str) -> None:
        self._counts['expired'] += n
        self._expired_by_reason[reason] += n

    def _read_arrival_order(self) -> list[Entry] | None:
        batch_size = self.config.batch_size
        if len(self._queue) < batch_size:
            return None
        popitem = self._queue.popitem
        out = []
        for _ in range(batch_size):
            arrival, (turn, _, _) = popitem(last=False)
            out.append((arrival, turn))
        return out

    def _fill_pool(self, update: int) -> tuple[dict[int, Turn], PoolColumns]:
        gated = self.method.gated
        pool, seen = (self._pending, self._seen)
        room = self.config.pool_size - len(pool)
        popitem = self._queue.popitem
        rows = []
        invalid = 0
        while room > 0 and self._queue:
            arrival, (turn, reason, row) = popitem(last=False)
            room -= 1
            if reason is None or not gated:
                pool[arrival] = turn
                seen[arrival] = update
                rows.append(row)
            else:
                invalid += 1
                self._invalid_by_reason[reason] += 1
        self._counts['invalid'] += invalid
        self._columns = self._columns.concat(PoolColumns.from_rows(rows))
        return (pool, self._columns)

    def _visiting_order(self, pool: dict[int, Turn], columns: PoolColumns) -> np.ndarray | None:
        if self.config.group_order == 'arrival':
            return None
        arrivals = columns.arrival.tolist()
        seen = np.fromiter((self._seen[a] for a in arrivals), dtype=np.int64, count=len(arrivals))
        _, first, inverse = np.unique(columns.group, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        oldest = np.full(len(first), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(oldest, inverse, seen)
        ids = [pool[arrivals[i]].rollout_id for i in first.tolist()]
        id_rank = np.empty(len(ids), dtype=np.int64)
        id_rank[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids))
        return np.lexsort((columns.arrival, id_rank[inverse], oldest[inverse]))

    def _compose_pooled(self, learner_version: int) -> tuple[list[Entry] | None, list[Turn] | None, list[int]]:
        pool, columns = self._fill_pool(learner_version)
        batch_size = self.config.batch_size
        if len(pool) < batch_size:
            return (None, None, [])
        rng = np.random.default_rng([self.config.seed, self._compositions])
        self._compositions += 1
        name = self.config.method
        keep = np.ones(len(pool), dtype=bool)
        perm = self._visiting_order(pool, columns)
        if self.method.select is not None:
            ordered = columns if perm is None else columns.take(perm)
            positions = self.method.select(pool, ordered, batch_size, self.config, rng)
            if perm is not None:
                positions = perm[positions]
            selected = [(a, pool[a]) for a in columns.arrival[positions].tolist()]
            keep[positions] = False
        else:
            entries = list(pool.items())
            if perm is not None:
                entries = [entries[i] for i in perm.tolist()]
            selected = self.method.compose(entries, batch_size, self.config, rng)
            chosen = {a for a, _ in selected}
            keep = np.fromiter((a not in chosen for a in pool), dtype=bool, count=len(pool))
        if len(selected) != batch_size:
            raise RuntimeError(f'method {name!r} returned {len(selected)} rows, expected {batch_size}')
        if len({a for a, _ in selected}) != batch_size:
            raise RuntimeError(f'method {name!r} selected a turn twice')
        pending_index = np.flatnonzero(keep)
        if len(pool) - len(pending_index) != batch_size:
            raise RuntimeError(f'method {name!r} selected a turn that is not in the candidate pool')
        candidates = list(pool.values())
        first_seen = [self._seen[a] for a in pool]
        for arrival, _ in selected:
            del pool[arrival]
            del self._seen[arrival]
        pending_index = self._expire_old_pending(columns, pending_index, learner_version)
        if self.config.max_pending is not None and len(pending_index) > self.config.max_pending:
            overflow = len(pending_index) - self.config.max_pending
            self._drop_pending(columns.arrival[pending_index[:overflow]])
            self._expire(overflow, 'pending_overflow')
            pending_index = pending_index[overflow:]
        self._columns = columns.take(pending_index)
        return (selected, candidates, first_seen)

    def _expire_old_pending(self, columns: PoolColumns, pending_index: np.ndarray, update: int) -> np.ndarray:
        age_limit = self.config.max_pending_age
        if age_limit is None or len(pending_index) == 0:
            return pending_index
        seen = self._seen
        arrivals = columns.arrival[pending_index]
        old = np.fromiter((update - seen[a] > age_limit for a in arrivals.tolist()), dtype=bool, count=len(arrivals))
        if old.any():
            self._drop_pending(arrivals[old])
            self._expire(int(np.count_nonzero(old)), 'pending_age')
        return pending_index[~old]

    def state_dict(self) -> dict[str, Any]:
        return {'version': 2, 'config': asdict(self.config), 'next_arrival': self._next_arrival, 'compositions': self._compositions, 'counts': dict(self._counts), 'invalid_by_reason': dict(self._invalid_by_reason), 'expired_by_reason': dict(self._expired_by_reason), 'queue': [[a, t.to_dict()] for a, (t, _, _) in self._queue.items()], 'pending': [[a, t.to_dict(), self._seen[a]] for a, t in self._pending.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get('version') not in (1, 2):
            raise ValueError(f"unsupported sampler state version {state.get('version')!r}")
        saved = SamplerConfig(**state['config'])
        if saved != self.config:
            raise ValueError(f'sampler state was saved with {saved}, this sampler has {self.config}')
        self._next_arrival = int(state['next_arrival'])
        self._compositions = int(state['compositions'])
        self._counts = {k: int(v) for k, v in state['counts'].items()}
        self._invalid_by_reason = {k: int(v) for k, v in state['invalid_by_reason'].items()}
        self._expired_by_reason = {'stale': 0, 'pending_age': 0, 'pending_overflow': 0}
        self._expired_by_reason.update({k: int(v) for k, v in state['expired_by_reason'].items()})
        self._queue = OrderedDict()
        self._expiry = []
        self._codes = {}
        self._pending, self._seen = ({}, {})
        for a, d, *stamp in state['pending']:
            turn = self.turn_from_dict(d)
            self._pending[int(a)] = turn
            self._seen[int(a)] = int(stamp[0]) if stamp else turn.policy_version
        self._columns = PoolColumns.from_rows([self._row(a, t) for a, t in self._pending.items()])
        for a, d in state['queue']:
            self._enqueue(int(a), self.turn_from_dict(d))

def make_sampler(config: SamplerConfig) -> Sampler:
    if not isinstance(config, SamplerConfig):
        raise TypeError(f'make_sampler expects a SamplerConfig, got {type(config).__name__}')
    return Sampler(config)
