"""The validity gate: one reason code per single defect, in the order of ``gate.REASONS``."""

from __future__ import annotations

import math

import pytest

from divopd import gate
from sampler_helpers import DEFECTS, turn


def test_reason_codes_are_exactly_the_issue_s() -> None:
    assert gate.REASONS == (
        "prompt_truncated",
        "empty_response",
        "missing_teacher",
        "missing_student_logprobs",
        "length_mismatch",
        "no_valid_token",
    )


def test_a_complete_turn_is_valid() -> None:
    assert gate.check(turn("r", n=3, score=1.0)) is None


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_single_defect_gets_its_own_code(defect: str) -> None:
    assert gate.check(turn("r", n=3, defect=defect)) == DEFECTS[defect]


def test_every_reason_code_is_reachable() -> None:
    assert set(DEFECTS.values()) == set(gate.REASONS)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_teacher_positions_are_unscored(bad: float) -> None:
    assert gate.check(turn("r", n=2, teacher_logprobs=[bad, bad])) == "no_valid_token"
    partly = turn("r", n=2, teacher_logprobs=[bad, -1.0])
    assert gate.check(partly) is None and partly.n_valid == 1


@pytest.mark.parametrize("array", ["action_mask", "student_logprobs", "teacher_logprobs", "teacher_valid_mask"])
@pytest.mark.parametrize("delta", [-1, 1])
def test_any_per_token_array_of_the_wrong_length_is_a_length_mismatch(array: str, delta: int) -> None:
    n = 3
    values = [True] * (n + delta) if "mask" in array else [-1.0] * (n + delta)
    assert gate.check(turn("r", n=n, **{array: values})) == "length_mismatch"


def test_teacher_valid_mask_must_align_with_the_action_mask() -> None:
    # aligned lengths but no shared valid position: the paper's "share at least one valid position"
    t = turn("r", n=3, action_mask=[True, True, False], teacher_valid_mask=[False, False, True])
    assert gate.check(t) == "no_valid_token"
    t = turn("r", n=3, action_mask=[True, True, False], teacher_valid_mask=[False, True, True])
    assert gate.check(t) is None and t.n_valid == 1
    # a teacher-valid mask one token short of the action mask is misaligned
    t = turn("r", n=3, action_mask=[True, True, True], teacher_valid_mask=[True, True])
    assert gate.check(t) == "length_mismatch"


def test_several_defects_report_the_first_in_reasons_order() -> None:
    t = turn("r", n=2, prompt_truncated=True, teacher_logprobs=None, student_logprobs=None)
    assert gate.check(t) == "prompt_truncated"
    t = turn("r", n=2, teacher_logprobs=None, student_logprobs=None)
    assert gate.check(t) == "missing_teacher"
    t = turn("r", n=2, student_logprobs=None, action_mask=[True])
    assert gate.check(t) == "missing_student_logprobs"
    t = turn("r", n=2, action_mask=[True], teacher_logprobs=[math.nan, math.nan])
    assert gate.check(t) == "length_mismatch"
