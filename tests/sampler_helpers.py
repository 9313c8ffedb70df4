"""Builders shared by the sampler tests: turns whose identity, version, length and focus score are set by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from divopd import Turn
from divopd.sampling import allocate_rollout_first

#: Single-defect kinds understood by :func:`turn` (``None`` = a valid turn), mapped to the gate code they must get.
DEFECTS: dict[str, str] = {
    "prompt_truncated": "prompt_truncated",
    "empty_response": "empty_response",
    "missing_teacher": "missing_teacher",
    "missing_student_logprobs": "missing_student_logprobs",
    "length_mismatch": "length_mismatch",
    "no_valid_token": "no_valid_token",
    "nan_teacher": "no_valid_token",
}


def turn(
    rollout_id: str,
    turn_index: int = 0,
    version: int = 0,
    n: int = 2,
    score: float = 0.0,
    defect: str | None = None,
    **overrides: Any,
) -> Turn:
    """A turn with ``n`` response tokens whose disagreement is exactly ``score`` (put on the first token).

    ``defect`` names one single defect from :data:`DEFECTS`; everything else about the turn is valid.
    """
    student = [float(score)] + [0.0] * (n - 1) if n > 0 else []
    fields: dict[str, Any] = dict(
        rollout_id=rollout_id,
        turn_index=turn_index,
        policy_version=version,
        prompt_ids=[1, 2, 3],
        response_ids=list(range(10, 10 + n)),
        action_mask=None,
        student_logprobs=student,
        teacher_logprobs=[0.0] * n,
        teacher_valid_mask=None,
    )
    if defect == "prompt_truncated":
        fields["prompt_truncated"] = True
    elif defect == "empty_response":
        fields.update(response_ids=[], student_logprobs=[], teacher_logprobs=[])
    elif defect == "missing_teacher":
        fields["teacher_logprobs"] = None
    elif defect == "missing_student_logprobs":
        fields["student_logprobs"] = None
    elif defect == "length_mismatch":
        fields["teacher_valid_mask"] = [True] * (n + 1)
    elif defect == "no_valid_token":
        fields["action_mask"] = [False] * n
    elif defect == "nan_teacher":
        fields["teacher_logprobs"] = [math.nan] * n
    elif defect is not None:
        raise ValueError(f"unknown defect {defect!r}")
    fields.update(overrides)
    return Turn(**fields)


def keys(turns: list[Turn]) -> list[tuple[str, int]]:
    """``(rollout_id, turn_index)`` of each turn, in order."""
    return [t.key for t in turns]


def focus_key(t: Turn) -> tuple[float, str, int]:
    """The paper's focus order as a sort key: disagreement descending, ties by ``(rollout_id, turn_index)``."""
    return (-t.disagreement, t.rollout_id, t.turn_index)


def slots(groups: list, batch_size: int, cap: int | None, tokens: bool = False) -> list[int]:
    """Per group (visiting order), how many turns :func:`allocate_rollout_first` gives it; ``groups`` are group sizes
    (turn cap) or, with ``tokens``, each group's response lengths in within-rollout order (token cap)."""
    lens = groups if tokens else [[1] * n for n in groups]
    group = np.repeat(np.arange(len(lens)), [len(g) for g in lens]).astype(np.int64)
    flat = np.array([n for g in lens for n in g], dtype=np.int64)
    chosen = allocate_rollout_first(group, batch_size, cap, flat if tokens else None)
    return np.bincount(group[chosen], minlength=len(lens)).tolist()
