"""Turn records: construction checks, derived fields (valid mask, |V|, focus score), serialisation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from divopd import Turn


def make(**kw) -> Turn:
    base = dict(rollout_id="r", turn_index=0, policy_version=0, prompt_ids=[1], response_ids=[5, 6, 7])
    base.update(kw)
    return Turn(**base)


@pytest.mark.parametrize(
    "field, value",
    [
        ("rollout_id", ""),
        ("rollout_id", 3),
        ("turn_index", -1),
        ("turn_index", 1.5),
        ("turn_index", True),
        ("policy_version", -2),
        ("policy_version", "1"),
    ],
)
def test_bad_identity_fields_raise_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"Turn.{field}"):
        make(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [("response_ids", [[1, 2]]), ("teacher_logprobs", ["x", "y", "z"]), ("action_mask", 3), ("prompt_ids", [2**40])],
)
def test_unreadable_arrays_raise_value_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"Turn.{field}"):
        make(**{field: value})


def test_missing_token_ids_raise() -> None:
    with pytest.raises(ValueError, match="response_ids"):
        make(response_ids=None)


def test_info_must_be_a_dict() -> None:
    with pytest.raises(ValueError, match="info"):
        make(info=[1])
    assert make(info=None).info == {}


def test_arrays_are_numpy_with_fixed_dtypes() -> None:
    t = make(student_logprobs=[-1, -2, -3], teacher_logprobs=[-1.5, -2, -3], action_mask=[1, 0, 1])
    assert t.response_ids.dtype == np.int32 and t.prompt_ids.dtype == np.int32
    assert t.student_logprobs.dtype == np.float32 and t.teacher_logprobs.dtype == np.float32
    assert t.action_mask.dtype == bool
    assert t.key == ("r", 0) and t.response_len == 3 and t.prompt_len == 1


def test_valid_mask_is_action_and_teacher_valid_and_finite_teacher() -> None:
    t = make(
        response_ids=[1, 2, 3, 4, 5],
        action_mask=[True, True, True, False, True],
        teacher_valid_mask=[True, False, True, True, True],
        teacher_logprobs=[-1.0, -1.0, math.nan, -1.0, -math.inf],
        student_logprobs=[-0.5] * 5,
    )
    # pos 0 valid; 1 teacher-invalid; 2 NaN teacher; 3 not the student's; 4 -inf teacher
    assert t.valid_mask.tolist() == [True, False, False, False, False]
    assert t.n_valid == 1
    assert t.disagreement == pytest.approx(0.5)


def test_valid_mask_defaults_to_every_finite_teacher_position() -> None:
    t = make(teacher_logprobs=[-1.0, math.inf, -2.0], student_logprobs=[-1.0, -1.0, -1.0])
    assert t.valid_mask.tolist() == [True, False, True]
    assert t.n_valid == 2
    # Σ over valid positions of (student − teacher) = (−1 − −1) + (−1 − −2) = 1
    assert t.disagreement == pytest.approx(1.0)


def test_valid_mask_is_empty_without_teacher_or_on_length_mismatch() -> None:
    assert make(student_logprobs=[0, 0, 0]).n_valid == 0
    t = make(teacher_logprobs=[0, 0, 0], action_mask=[True, True])
    assert t.length_mismatch == "action_mask"
    assert t.n_valid == 0 and t.valid_mask.shape == (3,)


def test_disagreement_is_a_signed_sum_and_skips_non_finite_student_positions() -> None:
    t = make(student_logprobs=[-1.0, math.nan, -4.0], teacher_logprobs=[-3.0, -1.0, -1.0])
    # (−1 − −3) + skipped + (−4 − −1) = 2 − 3 = −1
    assert t.disagreement == pytest.approx(-1.0)
    assert make(teacher_logprobs=[0, 0, 0]).disagreement == 0.0  # no student log probabilities
    assert make(teacher_logprobs=[0, 0, 0], student_logprobs=[1, 1, 1], action_mask=[0, 0, 0]).disagreement == 0.0


def test_length_mismatch_names_the_first_bad_array() -> None:
    assert make(student_logprobs=[0, 0], teacher_logprobs=[0]).length_mismatch == "student_logprobs"
    assert make(teacher_topk_ids=np.zeros((2, 4))).length_mismatch == "teacher_topk_ids"
    assert make(teacher_logprobs=[0, 0, 0]).length_mismatch is None


def test_topk_fields_must_be_two_dimensional() -> None:
    with pytest.raises(ValueError, match="teacher_topk_ids"):
        make(teacher_topk_ids=[1, 2, 3])


def test_to_dict_json_from_dict_round_trip_keeps_everything() -> None:
    t = make(
        action_mask=[True, False, True],
        student_logprobs=[-0.1, -0.2, -0.3],
        teacher_logprobs=[-1.0, math.nan, -math.inf],
        teacher_valid_mask=[True, True, False],
        prompt_truncated=True,
        info={"env": "toy", "success": False},
        teacher_topk_ids=np.arange(6).reshape(3, 2),
        teacher_topk_logprobs=np.full((3, 2), -0.5),
    )
    back = Turn.from_dict(json.loads(json.dumps(t.to_dict())))
    for name in ("rollout_id", "turn_index", "policy_version", "prompt_truncated", "info"):
        assert getattr(back, name) == getattr(t, name)
    for name in ("prompt_ids", "response_ids", "action_mask", "student_logprobs", "teacher_logprobs",
                 "teacher_valid_mask", "teacher_topk_ids", "teacher_topk_logprobs"):
        np.testing.assert_array_equal(getattr(back, name), getattr(t, name))
        assert getattr(back, name).dtype == getattr(t, name).dtype
    assert back.n_valid == t.n_valid == 1
    assert back.disagreement == t.disagreement


def test_derived_fields_raise_no_floating_point_warnings(recwarn: pytest.WarningsRecorder) -> None:
    t = make(student_logprobs=[-math.inf, math.inf, -1.0], teacher_logprobs=[-math.inf, -math.inf, -2.0])
    assert (t.n_valid, t.disagreement) == (1, 1.0)
    assert len(recwarn) == 0
