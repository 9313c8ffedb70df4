"""Turn records: one student response turn, tagged ``(rollout_id, turn_index, policy_version)`` (paper,
"Asynchronous multi-turn OPD"), the unit every part of divopd exchanges, and the finished :class:`Rollout`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["ResponseScores", "Rollout", "RolloutInfo", "Turn"]

_ArrayLike = Sequence[int] | Sequence[float] | Sequence[bool] | np.ndarray


def _as_array(values: Any, dtype: Any, name: str) -> np.ndarray | None:
    if values is None:
        return None
    try:
        arr = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"Turn.{name}: cannot be read as a {np.dtype(dtype).name} sequence ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"Turn.{name}: expected a 1-d sequence, got shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class ResponseScores:
    """A model's scores of one response of length L (a Turn's ``teacher_*``): ``logprobs`` [L] float32 (NaN without
    context), ``topk_ids`` [L, k] int32 (most likely first) and their ``topk_logprobs`` (``None`` without top-k)."""

    logprobs: np.ndarray
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None


@dataclass(eq=False)
class Turn:
    """One student response turn. Malformed types raise ``ValueError``; malformed content (missing scores, arrays of
    the wrong length, a truncated prompt) is legal and is what :func:`divopd.sampling.gate.check` names.

    Attributes:
        rollout_id, turn_index, policy_version: the rollout (episode), the turn's position in it (>= 0) and the
            student version that generated it (>= 0).
        prompt_ids, response_ids: token ids of the prompt (chat template + task + history) and of the response.
        action_mask: per response token, True where the token is the student's action (``None`` = all True).
        student_logprobs: per response token, log probability under the generating policy (``None`` = not kept).
        teacher_logprobs: per response token, frozen-teacher log probability (``None``, or NaN/±inf at a position:
            not scored).
        teacher_valid_mask: per response token, True where the teacher score is usable (``None`` = no extra mask).
        prompt_truncated: the explorer truncated the prompt (history past the context budget).
        info: free-form metadata (env, task, success, reward, score, horizon, teacher_acted, ...).
        teacher_topk_ids, teacher_topk_logprobs: optional [L, k] teacher top-k token ids and their log probabilities
            (the top-k reverse-KL estimator of :func:`divopd.learn.loss.opd_loss`).
    """

    rollout_id: str
    turn_index: int
    policy_version: int
    prompt_ids: _ArrayLike
    response_ids: _ArrayLike
    action_mask: _ArrayLike | None = None
    student_logprobs: _ArrayLike | None = None
    teacher_logprobs: _ArrayLike | None = None
    teacher_valid_mask: _ArrayLike | None = None
    prompt_truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    teacher_topk_ids: np.ndarray | None = None
    teacher_topk_logprobs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rollout_id, str) or not self.rollout_id:
            raise ValueError(f"Turn.rollout_id must be a non-empty str, got {self.rollout_id!r}")
        for name in ("turn_index", "policy_version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"Turn.{name} must be an int >= 0, got {value!r}")
            setattr(self, name, int(value))
        self.prompt_ids = _as_array(self.prompt_ids, np.int32, "prompt_ids")
        self.response_ids = _as_array(self.response_ids, np.int32, "response_ids")
        if self.prompt_ids is None or self.response_ids is None:
            raise ValueError("Turn.prompt_ids and Turn.response_ids are required (use an empty sequence for none)")
        for name, dtype in (("action_mask", bool), ("student_logprobs", np.float32), ("teacher_logprobs", np.float32),
                            ("teacher_valid_mask", bool)):
            setattr(self, name, _as_array(getattr(self, name), dtype, name))
        self.prompt_truncated = bool(self.prompt_truncated)
        for name, dtype in (("teacher_topk_ids", np.int32), ("teacher_topk_logprobs", np.float32)):
            value = getattr(self, name)
            if value is not None:
                arr = np.asarray(value, dtype=dtype)
                if arr.ndim != 2:
                    raise ValueError(f"Turn.{name}: expected shape [response_len, k], got {arr.shape}")
                setattr(self, name, arr)
        if self.info is None:
            self.info = {}
        if not isinstance(self.info, dict):
            raise ValueError(f"Turn.info must be a dict, got {type(self.info).__name__}")

    @property
    def key(self) -> tuple[str, int]:
        """``(rollout_id, turn_index)``: the turn's identity in the paper."""
        return (self.rollout_id, self.turn_index)

    @property
    def response_len(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[0])

    @cached_property
    def length_mismatch(self) -> str | None:
        """Name of the first per-token array whose length differs from the response, else ``None``."""
        n = self.response_len
        for name in ("action_mask", "student_logprobs", "teacher_logprobs", "teacher_valid_mask", "teacher_topk_ids",
                     "teacher_topk_logprobs"):
            arr = getattr(self, name)
            if arr is not None and arr.shape[0] != n:
                return name
        return None

    @cached_property
    def valid_mask(self) -> np.ndarray:
        """Action ∧ teacher-valid ∧ finite teacher logprob, per response token (all False when unusable)."""
        if self.teacher_logprobs is None or self.length_mismatch is not None:
            return np.zeros(self.response_len, dtype=bool)
        mask = np.isfinite(self.teacher_logprobs)
        if self.action_mask is not None:
            mask &= self.action_mask
        if self.teacher_valid_mask is not None:
            mask &= self.teacher_valid_mask
        return mask

    @property
    def teacher_masked_tokens(self) -> int:
        """Response positions whose teacher log prob is not finite (masked or unscorable); 0 for an unscored turn."""
        return 0 if self.teacher_logprobs is None else int(np.count_nonzero(~np.isfinite(self.teacher_logprobs)))

    @cached_property
    def n_valid(self) -> int:
        """Number of valid (scored, student-action) tokens: the paper's |V_t|."""
        return int(np.count_nonzero(self.valid_mask))

    @cached_property
    def disagreement(self) -> float:
        """Focus score: Σ over valid tokens of (student_logprob − teacher_logprob) with the generating policy's
        log probabilities (non-finite ones skipped); 0.0 without student log probabilities or a valid token."""
        if self.student_logprobs is None or self.n_valid == 0:
            return 0.0
        mask = self.valid_mask & np.isfinite(self.student_logprobs)
        diff = np.subtract(self.student_logprobs, self.teacher_logprobs, out=None, dtype=np.float64, where=mask)
        return float(diff[mask].sum())

    @cached_property
    def kl_tokens(self) -> int:
        """Tokens :attr:`disagreement` sums over: valid tokens whose student log probability is finite."""
        if self.student_logprobs is None or self.n_valid == 0:
            return 0
        return int(np.count_nonzero(self.valid_mask & np.isfinite(self.student_logprobs)))

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (lists, ints, floats, NaN kept), for state dicts and JSON."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in out.items():
            if isinstance(value, np.ndarray):
                out[name] = value.tolist()
        out["info"] = dict(self.info)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Turn:
        return cls(**data)

    def __repr__(self) -> str:
        return (f"Turn(rollout_id={self.rollout_id!r}, turn_index={self.turn_index}, "
                f"policy_version={self.policy_version}, prompt_len={self.prompt_len}, "
                f"response_len={self.response_len}, n_valid={self.n_valid})")


@dataclass
class RolloutInfo:
    """What a rollout carries besides its turns: the episode's outcome and counts, as the explorer reports them (a
    ``partial`` chunk of a running rollout, ``explorer.enqueue: turn``: those so far)."""

    rollout_id: str
    explorer_id: int
    env: str
    task: str
    success: bool
    #: the env's score at the end (so far, for a chunk)
    score: float
    #: env steps taken (student and teacher)
    horizon: int
    student_turns: int
    #: turns the teacher acted under +R (not queued)
    teacher_turns: int = 0
    takeovers: int = 0
    #: the env crashed; the turns so far are kept
    crashed: bool = False
    #: the rollout was cut at the step limit (``max_steps`` or the curriculum's depth)
    hit_step_limit: bool = False
    truncated_turns: int = 0
    unscored_turns: int = 0
    policy_version_min: int = 0
    policy_version_max: int = 0
    #: a chunk of a running rollout; the learner counts a rollout by its last chunk
    partial: bool = False
    #: the explorer's newest weight load, in seconds (the learner logs it as ``time/weight_load_s``)
    weight_load_s: float = 0.0
    #: explorer seconds since its previous rollout (or chunk) in generation, env steps and teacher scoring, summed by
    #: the learner as ``time/generate_s``, ``time/env_s``, ``time/score_s`` (wall times: not compared by ``==``)
    generate_s: float = field(default=0.0, compare=False)
    env_s: float = field(default=0.0, compare=False)
    score_s: float = field(default=0.0, compare=False)

    def set_stage_times(self, totals: dict[str, float], handed_over: dict[str, float]) -> None:
        """Set ``generate_s``, ``env_s``, ``score_s`` from an explorer's cumulative ``totals`` less ``handed_over``
        (those at its previous rollout), then move ``handed_over`` up to ``totals``."""
        for key, name in (("time/generate", "generate_s"), ("time/env", "env_s"), ("time/teacher_score", "score_s")):
            setattr(self, name, float(totals.get(key, 0.0)) - handed_over.get(key, 0.0))
            handed_over[key] = float(totals.get(key, 0.0))


@dataclass
class Rollout:
    """One finished rollout (``explorer.enqueue: turn``: a chunk of one): its student turns, in order, and its info."""

    turns: list[Turn]
    info: RolloutInfo
