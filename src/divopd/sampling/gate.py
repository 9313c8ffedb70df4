"""The validity gate (paper, Section 3): "A turn is valid only if its prompt was not truncated and it contains the
tokens, teacher log probabilities, and action mask needed by the loss. If a teacher-valid mask is supplied, it must
align with the action mask and share at least one valid position." A turn gets ``None`` (valid) or the first of its
defects in :data:`REASONS` order; invalid turns are discarded before batch selection."""

from __future__ import annotations

from divopd.experience.turn import Turn

__all__ = ["REASONS", "check", "verdict"]

#: Reason codes, in the order they are checked.
REASONS: tuple[str, ...] = (
    "prompt_truncated",  # the explorer truncated the prompt (history past the context budget)
    "empty_response",  # no response token at all
    "missing_teacher",  # teacher_logprobs is None: the turn was never scored
    "missing_student_logprobs",  # student_logprobs is None: no cached focus score
    "length_mismatch",  # a per-token array's length differs from the response's
    "no_valid_token",  # action ∧ teacher-valid ∧ finite teacher logprob is empty (a dead row)
)


def verdict(prompt_truncated: bool, response_len: int, has_teacher: bool, has_student: bool,
            length_mismatch: str | None, n_valid: int) -> str | None:
    """The gate over a record's facts: ``None`` when it may enter a batch, else the reason code of its first defect.
    Framework records that never become a :class:`Turn` are judged here with the facts they carry."""
    if prompt_truncated:
        return "prompt_truncated"
    if response_len == 0:
        return "empty_response"
    if not has_teacher:
        return "missing_teacher"
    if not has_student:
        return "missing_student_logprobs"
    if length_mismatch is not None:
        return "length_mismatch"
    if n_valid == 0:
        return "no_valid_token"
    return None


def check(turn: Turn) -> str | None:
    """:func:`verdict` of a :class:`Turn`."""
    return verdict(turn.prompt_truncated, turn.response_len, turn.teacher_logprobs is not None,
                   turn.student_logprobs is not None, turn.length_mismatch, turn.n_valid)
