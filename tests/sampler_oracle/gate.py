"""The validity gate (paper, Section 3: "A turn is valid only if…").

    A turn is valid only if its prompt was not truncated and it contains the tokens, teacher log probabilities, and
    action mask needed by the loss. If a teacher-valid mask is supplied, it must align with the action mask and share
    at least one valid position. Turns that fail these checks are discarded before batch selection.

:func:`check` returns ``None`` for a valid turn, else exactly one reason code from :data:`REASONS`. When a turn has
several defects, the first in the order of :data:`REASONS` is reported.
"""

from __future__ import annotations

from divopd.experience.turn import Turn

__all__ = ["REASONS", "check"]

#: Reason codes, in the order they are checked.
REASONS: tuple[str, ...] = (
    "prompt_truncated",  # the explorer truncated the prompt (history past the context budget)
    "empty_response",  # no response token at all
    "missing_teacher",  # teacher_logprobs is None: the turn was never scored
    "missing_student_logprobs",  # student_logprobs is None: no cached focus score
    "length_mismatch",  # a per-token array's length differs from the response's
    "no_valid_token",  # action ∧ teacher-valid ∧ finite teacher logprob is empty (a dead row)
)


def check(turn: Turn) -> str | None:
    """Validity gate: ``None`` when ``turn`` may enter a batch, else the reason code of its first defect."""
    if turn.prompt_truncated:
        return "prompt_truncated"
    if turn.response_len == 0:
        return "empty_response"
    if turn.teacher_logprobs is None:
        return "missing_teacher"
    if turn.student_logprobs is None:
        return "missing_student_logprobs"
    if turn.length_mismatch is not None:
        return "length_mismatch"
    if turn.n_valid == 0:
        return "no_valid_token"
    return None
