"""What the sampler knows of a turn: the :class:`Candidate` record an adapter builds once, and the numpy
:class:`Columns` the sampler keeps them in (one row per candidate, with the caller's opaque payload)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Generic, TypeVar

import numpy as np

import divopd.sampling.gate as gate
from divopd.experience.turn import Turn

__all__ = ["Candidate", "Columns", "task_key"]

P = TypeVar("P")


def task_key(task: Any, rollout_id: str) -> str:
    """A turn's task group: ``"task:<task>"``, or ``"rollout:<rollout_id>"`` when no task was recorded."""
    return f"task:{task}" if task is not None else f"rollout:{rollout_id}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One turn as the selection rules read it: its tags, response length, the paper's |V_t| (``n_valid``; 0 = a dead
    row), the cached focus score Σ_{V_t}(log π_v − log π_teacher) (``disagreement``, over ``kl_tokens`` tokens with a
    finite student log prob), the gate's verdict (``reason``: ``None`` or a :data:`~divopd.sampling.gate.REASONS`
    code) and its task group (:func:`task_key`)."""

    rollout_id: str
    turn_index: int
    policy_version: int
    response_len: int
    n_valid: int
    kl_tokens: int
    disagreement: float
    reason: str | None
    task: str

    @classmethod
    def of(cls, turn: Turn) -> Candidate:
        """The candidate of a divopd :class:`Turn` (computes its gate verdict and focus score)."""
        return cls(turn.rollout_id, turn.turn_index, turn.policy_version, turn.response_len, turn.n_valid,
                   turn.kl_tokens, turn.disagreement, gate.check(turn),
                   task_key(turn.info.get("task"), turn.rollout_id))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Column name -> dtype; ``reason`` holds the index into gate.REASONS, -1 for a valid candidate.
_DTYPES: dict[str, Any] = {
    "arrival": np.int64, "policy_version": np.int64, "rollout_id": np.str_, "turn_index": np.int64,
    "response_len": np.int64, "n_valid": np.int64, "kl_tokens": np.int64, "disagreement": np.float64,
    "reason": np.int8, "task": np.str_, "seen": np.int64, "payload": object,
}
_CODE = {reason: i for i, reason in enumerate(gate.REASONS)}
_FIELDS = tuple(f.name for f in fields(Candidate))


@dataclass(frozen=True)
class Columns(Generic[P]):
    """Candidates as numpy columns in arrival order: the fields of :class:`Candidate`, ``arrival``, ``seen`` (the update
    that read the row into the pool, Algorithm 1 step 3; -1 while queued) and ``payload`` (the caller's object)."""

    arrival: np.ndarray
    policy_version: np.ndarray
    rollout_id: np.ndarray
    turn_index: np.ndarray
    response_len: np.ndarray
    n_valid: np.ndarray
    kl_tokens: np.ndarray
    disagreement: np.ndarray
    reason: np.ndarray
    task: np.ndarray
    seen: np.ndarray
    payload: np.ndarray

    @classmethod
    def of(cls, candidates: Sequence[Candidate], payloads: Sequence[P], arrivals: int | Sequence[int] = 0,
           seen: Sequence[int] | None = None) -> Columns[P]:
        """Rows for ``candidates`` with ``payloads``, numbered from ``arrivals`` on (or by their own ``arrivals``),
        queued (or first seen at the updates ``seen``)."""
        n = len(candidates)
        if n == 0:
            return cls.empty()
        numeric = {name: np.fromiter((getattr(c, name) for c in candidates), dtype=_DTYPES[name], count=n)
                   for name in ("policy_version", "turn_index", "response_len", "n_valid", "kl_tokens",
                                "disagreement")}
        return cls(
            arrival=np.arange(arrivals, arrivals + n, dtype=np.int64) if isinstance(arrivals, int)
            else np.asarray(arrivals, dtype=np.int64),
            rollout_id=np.array([c.rollout_id for c in candidates], dtype=np.str_),
            reason=np.fromiter((-1 if c.reason is None else _CODE[c.reason] for c in candidates), np.int8, n),
            task=np.array([c.task for c in candidates], dtype=np.str_),
            seen=np.full(n, -1, dtype=np.int64) if seen is None else np.asarray(seen, dtype=np.int64),
            payload=np.fromiter(payloads, dtype=object, count=n),
            **numeric,
        )

    @classmethod
    def empty(cls) -> Columns[P]:
        return cls(**{name: np.zeros(0, dtype=dtype) for name, dtype in _DTYPES.items()})

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    def take(self, index: np.ndarray | slice) -> Columns[P]:
        """The rows at ``index`` (positions, a boolean mask or a slice)."""
        return Columns(**{name: getattr(self, name)[index] for name in _DTYPES})

    @classmethod
    def join(cls, parts: Sequence[Columns[P]]) -> Columns[P]:
        """The rows of ``parts``, one after the other."""
        parts = [p for p in parts if len(p)]
        if len(parts) <= 1:
            return parts[0] if parts else cls.empty()
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in _DTYPES})

    def stamped(self, update: int) -> Columns[P]:
        """These rows read into the pool at ``update`` (their first-seen stamp)."""
        return replace(self, seen=np.full(len(self), update, dtype=np.int64))

    def candidates(self) -> list[Candidate]:
        """The rows as :class:`Candidate` records."""
        cols = [getattr(self, name).tolist() for name in _FIELDS]
        at = _FIELDS.index("reason")
        cols[at] = [None if r < 0 else gate.REASONS[r] for r in cols[at]]
        return [Candidate(*row) for row in zip(*cols, strict=True)]

    def payloads(self) -> list[P]:
        return self.payload.tolist()
