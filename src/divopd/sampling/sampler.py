"""The sampler (Algorithm 1's queue consumption): queue, validity gate, candidate pool with pending turns, expiry and
the ledger, over candidate columns. Every turn ends in one ledger bucket (``selected``, ``expired``, ``invalid``) or is
still waiting (``pending``, ``queued``); docs/concepts/sampler.md walks the data path."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Generic, TypeVar

import numpy as np

import divopd.sampling.gate as gate
from divopd.errors import UsageError
from divopd.experience.turn import Turn
from divopd.sampling.candidate import Candidate, Columns
from divopd.sampling.config import SamplerConfig
from divopd.sampling.ledger import Ledger
from divopd.sampling.registry import get_method
from divopd.sampling.rules import is_stale, pending_expiry
from divopd.sampling.stats import BatchStats, batch_stats

__all__ = ["STATE_VERSION", "SamplerConfig", "Batch", "Sampler", "make_sampler"]

P = TypeVar("P")

#: The version of :meth:`Sampler.state_dict`'s format; :meth:`Sampler.load_state_dict` reads only this one.
STATE_VERSION = 3


@dataclass
class Batch(Generic[P]):
    """A composed learner batch: the selected payloads (what the caller added) in composition order, their arrival
    numbers, its :class:`BatchStats`, the payloads of the candidates the method chose from (``vanilla``: the batch)
    with their first-seen updates (pooled methods), and per-row loss weights (mean 1; ``None`` = unit weights)."""

    payloads: list[P]
    arrivals: list[int]
    learner_version: int
    stats: BatchStats
    candidates: list[P] = field(default_factory=list, repr=False)
    first_seen: list[int] = field(default_factory=list, repr=False)
    row_weights: list[float] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.payloads)


class Sampler(Generic[P]):
    """Queue + pool + ledger around one registered selection method, one opaque payload per candidate."""

    def __init__(self, config: SamplerConfig, track_departed: bool = False) -> None:
        self.config = config
        self.method = get_method(config.method)
        self._queue: deque[Columns[P]] = deque()  # not yet read into the pool: chunks in arrival order
        self._pool: Columns[P] = Columns.empty()  # pending: gated, unselected, first-seen stamped
        self._next_arrival = 0
        self._compositions = 0
        self._ledger = Ledger()
        self._departed: list[Columns[P]] | None = [] if track_departed else None

    def add(self, payloads: P | Iterable[P], candidates: Sequence[Candidate] | None = None) -> list[int]:
        """Queue arrivals; returns their arrival numbers. ``candidates``: one per payload, built by the caller's
        adapter; ``None`` when the payloads are divopd :class:`Turn` objects (read with :meth:`Candidate.of`)."""
        items: list[Any] = [payloads] if isinstance(payloads, Turn) else list(payloads)  # type: ignore[arg-type]
        if candidates is None:
            for item in items:  # check all first: a bad item must not leave half the call queued and uncounted
                if not isinstance(item, Turn):
                    raise TypeError(f"Sampler.add expects divopd.Turn objects, got {type(item).__name__}")
            candidates = [Candidate.of(t) for t in items]
        elif len(candidates) != len(items):
            raise ValueError(f"Sampler.add: {len(candidates)} candidates for {len(items)} payloads")
        first = self._next_arrival
        self._next_arrival += len(items)
        self._ledger.received += len(items)
        if items:
            self._queue.append(Columns.of(candidates, items, first))
            if len(self._queue) > 64:  # many small adds: one chunk, so that a composition visits few
                self._queue = deque([Columns.join(list(self._queue))])
        return list(range(first, self._next_arrival))

    def _read_queue(self, n: int) -> Columns[P]:
        """The first ``n`` queued rows (fewer when fewer are queued), taken off the queue."""
        parts: list[Columns[P]] = []
        while n > 0 and self._queue:
            head = self._queue[0]
            if len(head) <= n:
                parts.append(self._queue.popleft())
            else:
                parts.append(head.take(slice(0, n)))
                self._queue[0] = head.take(slice(n, None))
            n -= len(parts[-1])
        return Columns.join(parts)

    @property
    def ledger(self) -> Ledger:
        """A snapshot of the counters; ``received == selected + expired + invalid + pending + queued``."""
        led = self._ledger
        return replace(led, pending=len(self._pool), queued=self.queued,
                       invalid_by_reason=dict(led.invalid_by_reason), expired_by_reason=dict(led.expired_by_reason))

    @property
    def waiting(self) -> int:
        """Turns not yet decided (pending + queued)."""
        return len(self._pool) + self.queued

    @property
    def queued(self) -> int:
        """Turns not yet read into the pool."""
        return sum(len(c) for c in self._queue)

    def fresh(self, learner_version: int) -> int:
        """Waiting turns that are not stale at ``learner_version``."""
        stale = self.config.max_staleness
        return sum(int(np.count_nonzero(~is_stale(c.policy_version, learner_version, stale)))
                   for c in (self._pool, *self._queue))

    def waiting_payloads(self) -> list[P]:
        """The payloads of the turns still waiting (pending, then queued), in that order."""
        return [p for c in (self._pool, *self._queue) for p in c.payloads()]

    def take_departed(self) -> list[P]:
        """The payloads of the turns that left unselected since the last call (a sampler with ``track_departed``)."""
        if self._departed is None:
            raise RuntimeError("Sampler.take_departed needs a sampler built with track_departed=True")
        out = [p for c in self._departed for p in c.payloads()]
        self._departed = []
        return out

    def _drop(self, cols: Columns[P], gone: np.ndarray, reason: str | None) -> Columns[P]:
        """``cols`` without the rows ``gone`` (a mask), counted expired for ``reason`` (``None``: already counted)."""
        n = int(np.count_nonzero(gone))
        if n == 0:
            return cols
        if reason is not None:
            self._ledger.expired += n
            self._ledger.expired_by_reason[reason] += n
        if self._departed is not None:
            self._departed.append(cols.take(gone))
        return cols.take(~gone)

    def next_batch(self, learner_version: int) -> Batch[P] | None:
        """Compose exactly ``batch_size`` turns for ``learner_version``, or ``None`` when too few are eligible (stale
        turns are expired first; a pooled method may still have read fresh turns into the pool and rejected some)."""
        if isinstance(learner_version, bool) or not isinstance(learner_version, (int, np.integer)):
            raise TypeError(f"learner_version must be an int, got {learner_version!r}")
        learner_version = int(learner_version)
        led = self._ledger
        before_expired, before_invalid = led.expired, led.invalid
        stale = self.config.max_staleness  # Algorithm 1, step 1
        self._pool = self._drop(self._pool, is_stale(self._pool.policy_version, learner_version, stale), "stale")
        self._queue = deque(c for c in (self._drop(c, is_stale(c.policy_version, learner_version, stale), "stale")
                                        for c in self._queue) if len(c))
        composed = self._compose_pooled(learner_version) if self.method.pooled else self._read_arrival_order()
        if composed is None:
            return None
        chosen, pool = composed
        led.selected += len(chosen)
        stats = batch_stats(chosen.candidates(), learner_version)
        stats.update(expired=led.expired - before_expired, invalid=led.invalid - before_invalid,
                     pending=len(self._pool), queued=self.queued, candidates=len(pool),
                     candidate_rollouts=len(set(pool.rollout_id.tolist())))
        return Batch(chosen.payloads(), chosen.arrival.tolist(), learner_version, stats, candidates=pool.payloads(),
                     first_seen=pool.seen.tolist() if self.method.pooled else [],
                     row_weights=None if self.method.row_weights is None else self.method.row_weights(chosen))

    def _read_arrival_order(self) -> tuple[Columns[P], Columns[P]] | None:
        """``vanilla``: the next B (non-stale) turns in arrival order, ungated."""
        batch_size = self.config.batch_size
        if self.queued < batch_size:
            return None
        chosen = self._read_queue(batch_size)
        return chosen, chosen

    def _compose_pooled(self, update: int) -> tuple[Columns[P], Columns[P]] | None:
        """Algorithm 1 for a pooled method: ``(selected rows, the pool they were chosen from)``."""
        read = self._read_queue(self.config.pool_size - len(self._pool))  # steps 2-3
        if self.method.gated:
            invalid = read.reason >= 0
            if invalid.any():
                counts = np.bincount(read.reason[invalid], minlength=len(gate.REASONS)).tolist()
                for reason, n in zip(gate.REASONS, counts, strict=True):
                    self._ledger.invalid_by_reason[reason] += n
                self._ledger.invalid += int(np.count_nonzero(invalid))
                read = self._drop(read, invalid, None)
        pool = self._pool = Columns.join([self._pool, read.stamped(update)])
        batch_size = self.config.batch_size
        if len(pool) < batch_size:
            return None
        rng = np.random.default_rng([self.config.seed, self._compositions])
        self._compositions += 1
        positions = np.asarray(self.method.select(pool, batch_size, self.config, rng), dtype=np.intp)  # steps 4-7
        name = self.config.method
        if len(positions) != batch_size:
            raise RuntimeError(f"method {name!r} returned {len(positions)} rows, expected {batch_size}")
        if ((positions < 0) | (positions >= len(pool))).any():
            raise RuntimeError(f"method {name!r} selected a turn that is not in the candidate pool")
        keep = np.ones(len(pool), dtype=bool)
        keep[positions] = False
        if len(pool) - int(np.count_nonzero(keep)) != batch_size:
            raise RuntimeError(f"method {name!r} selected a turn twice")
        rest = pool.take(keep)
        old, overflow = pending_expiry(rest.seen, update, self.config.max_pending_age, self.config.max_pending)
        rest = self._drop(rest, old, "pending_age")  # step 8
        self._pool = self._drop(rest, overflow[~old], "pending_overflow")
        return pool.take(positions), pool

    def state_dict(self, encode: Callable[[P], Any] = Turn.to_dict) -> dict[str, Any]:  # type: ignore[assignment]
        """All that is needed to continue exactly (JSON-able): config, counters, and every waiting turn as ``[arrival,
        candidate, encode(payload)]`` (``queue``), plus its first-seen update (``pending``)."""
        queue, led = Columns.join(list(self._queue)), self._ledger

        def rows(cols: Columns[P]) -> Iterable[tuple[int, Candidate, P, int]]:
            return zip(cols.arrival.tolist(), cols.candidates(), cols.payloads(), cols.seen.tolist(), strict=True)

        return {
            "version": STATE_VERSION,
            "config": asdict(self.config),
            "next_arrival": self._next_arrival,
            "compositions": self._compositions,
            "counts": {"received": led.received, "selected": led.selected, "expired": led.expired,
                       "invalid": led.invalid},
            "invalid_by_reason": dict(led.invalid_by_reason),
            "expired_by_reason": dict(led.expired_by_reason),
            "queue": [[a, c.to_dict(), encode(p)] for a, c, p, _ in rows(queue)],
            "pending": [[a, c.to_dict(), encode(p), s] for a, c, p, s in rows(self._pool)],
        }

    def load_state_dict(self, state: Mapping[str, Any],
                        decode: Callable[[Any], P] = Turn.from_dict) -> None:  # type: ignore[assignment]
        """Restore :meth:`state_dict` output; :class:`UsageError` for another format version or another config."""
        version = state.get("version") if isinstance(state, Mapping) else None
        if version != STATE_VERSION:
            raise UsageError(f"sampler state version {version!r} was written by another divopd; this one reads "
                             f"sampler state version {STATE_VERSION} only (start a new run, or resume with the divopd "
                             "that wrote it)")
        saved = SamplerConfig(**state["config"])
        if saved != self.config:
            raise UsageError(f"sampler state was saved with {saved}, this sampler has {self.config}")
        self._next_arrival = int(state["next_arrival"])
        self._compositions = int(state["compositions"])
        self._ledger = Ledger(**{k: int(v) for k, v in state["counts"].items()},
                              invalid_by_reason={k: int(v) for k, v in state["invalid_by_reason"].items()},
                              expired_by_reason={k: int(v) for k, v in state["expired_by_reason"].items()})

        def columns(entries: list[list[Any]], stamped: bool) -> Columns[P]:
            return Columns.of([Candidate(**e[1]) for e in entries], [decode(e[2]) for e in entries],
                              [int(e[0]) for e in entries], [int(e[3]) for e in entries] if stamped else None)

        self._pool = columns(state["pending"], True)
        self._queue = deque([columns(state["queue"], False)])


def make_sampler(config: SamplerConfig, track_departed: bool = False) -> Sampler[Any]:
    """Build the sampler for ``config.method`` (``track_departed``: see :meth:`Sampler.take_departed`)."""
    if not isinstance(config, SamplerConfig):
        raise TypeError(f"make_sampler expects a SamplerConfig, got {type(config).__name__}")
    return Sampler(config, track_departed)
