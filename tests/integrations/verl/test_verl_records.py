"""verl records ⇄ divopd turns, and the plug-in's settings: what the composer reads from a record, what
it rejects through the gate, what stops the run with one line."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from verl_helpers import FIXTURE_LOG, SETTINGS, THRESHOLD, turn_to_record  # noqa: E402

from divopd.errors import UsageError  # noqa: E402
from divopd.experience import Turn  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.integrations.verl import DivOPDReplayBuffer, divopd_config  # noqa: E402
from divopd.integrations.verl_records import (  # noqa: E402
    SUMMARY_TAG,
    VerlRecordError,
    candidate_of,
    parse_key,
    record_summary,
)
from divopd.sampling import Candidate, gate  # noqa: E402


def _values(fields: dict) -> dict:
    return {k: v for k, v in fields.items()}


def test_every_logged_turn_survives_the_record_round_trip() -> None:
    n = 0
    for turn, _, _ in read_log(FIXTURE_LOG):
        key, fields, tag = turn_to_record(turn)
        back = record_summary(key, tag, _values(fields))[0]
        assert back.key == turn.key and back.policy_version == turn.policy_version
        assert back.n_valid == turn.n_valid and back.disagreement == turn.disagreement
        assert np.array_equal(back.valid_mask, turn.valid_mask) and gate.check(back) == gate.check(turn)
        assert back.info["task"] == turn.info["task"] and back.info["verl_key"] == key
        assert candidate_of(key, tag) == Candidate.of(turn)  # what the sampler reads, from the tag alone
        n += 1
    assert n == 240


def test_teacher_rows_are_matched_to_the_response_tokens_by_id() -> None:
    prompts, responses = torch.tensor([7, 8]), torch.tensor([3, 4, 5])
    # verl's teacher manager: [prompt + response, K] rows, row i scores sequence token i + 1 (vLLM's prompt log
    # probs; the last row a dummy), so response token j is row P - 1 + j = 1 + j (top-2 here)
    ids = torch.tensor([[8, 0], [3, 9], [9, 4], [1, 2], [0, 0]])
    lps = torch.tensor([[-0.9, -2.0], [-0.1, -2.0], [-0.3, -0.7], [-1.0, -1.5], [0.0, 0.0]])
    values = {"prompts": prompts, "responses": responses, "response_mask": torch.ones(3, dtype=torch.int64),
              "rollout_log_probs": torch.tensor([-0.5, -0.5, -0.5]), "teacher_logprobs": lps, "teacher_ids": ids}
    turn = record_summary("u_0_2", {"min_global_steps": 3}, values)[0]
    assert (turn.rollout_id, turn.turn_index, turn.policy_version) == ("u_0", 2, 3)
    np.testing.assert_array_equal(turn.teacher_logprobs[:2], np.float32([-0.1, -0.7]))
    assert np.isnan(turn.teacher_logprobs[2])  # token 5 is not among the teacher's ids: unscored
    assert turn.n_valid == 2


@pytest.mark.parametrize(("drop", "change", "reason"), [
    ("teacher_logprobs", None, "missing_teacher"),
    ("rollout_log_probs", None, "missing_student_logprobs"),
    (None, ("response_mask", torch.ones(2, dtype=torch.int64)), "length_mismatch"),
    (None, ("rollout_log_probs", torch.ones(4)), "length_mismatch"),
])
def test_a_record_missing_what_the_loss_needs_is_a_turn_the_gate_rejects(drop, change, reason: str) -> None:
    turn = Turn("r", 0, 1, [1, 2], [3, 4, 5], student_logprobs=[-1.0] * 3, teacher_logprobs=[-2.0] * 3)
    key, fields, tag = turn_to_record(turn)
    fields.pop(drop, None)
    if change is not None:
        fields[change[0]] = change[1]
    turn, summary = record_summary(key, tag, fields)
    assert gate.check(turn) == candidate_of(key, {**tag, SUMMARY_TAG: summary}).reason == reason


@pytest.mark.parametrize(("key", "tag", "values", "names"), [
    ("abc", {"min_global_steps": 0}, {}, "turn index"),
    ("_3", {"min_global_steps": 0}, {}, "rollout id"),
    ("u_0_1", {"global_steps": 4}, {}, "min_global_steps"),
    ("u_0_1", {"min_global_steps": -1}, {}, "min_global_steps=-1"),
    ("u_0_1", {"min_global_steps": 0}, {"prompts": torch.tensor([1])}, "'responses'"),
])
def test_a_record_without_identity_or_version_stops_with_one_line(key: str, tag: dict, values: dict,
                                                                  names: str) -> None:
    with pytest.raises(VerlRecordError, match=names) as err:
        if values or "min_global_steps" not in tag or tag["min_global_steps"] >= 0:
            record_summary(key, tag, values or {"prompts": torch.tensor([1]), "responses": torch.tensor([2])})[0]
        else:
            record_summary(key, tag, {"prompts": torch.tensor([1]), "responses": torch.tensor([2])})[0]
    assert isinstance(err.value, UsageError) and "\n" not in str(err.value)


def test_parse_key_splits_at_the_last_underscore() -> None:
    assert parse_key("3f2a_1_4") == ("3f2a_1", 4)
    assert parse_key("my_rollout_0") == ("my_rollout", 0)


def test_settings_take_the_paper_defaults_and_verls_threshold() -> None:
    config = divopd_config({}, None, 256)
    assert (config.method, config.batch_size, config.pool_factor, config.cap, config.max_staleness,
            config.max_pending_age) == ("divopd", 256, 4, 4, 2, 8)
    assert divopd_config({}, 3, 8).max_staleness == 2  # a span of 3 versions = staleness 2
    assert divopd_config({"max_staleness": 5}, 3, 8).max_staleness == 5  # an explicit setting wins
    assert divopd_config({"max_pending_age": None, "method": "vanilla"}, 8, 8).max_pending_age is None
    assert divopd_config(SETTINGS, THRESHOLD, SETTINGS["batch_size"]).cap == SETTINGS["cap"]


@pytest.mark.parametrize(("kwargs", "threshold", "strategy", "message"), [
    ({"methd": "divopd"}, 3, "drop", "unknown key"),
    ({"method": "nope"}, 3, "drop", "unknown sampler method"),
    ({"cap": 0}, 3, "drop", "cap"),
    ({"batch_size": 4}, 3, "drop", "batch_size=4"),
    ({}, 3, "wait", "max_off_policy_strategy=wait"),
])
def test_bad_settings_stop_with_one_line(kwargs: dict, threshold: int, strategy: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as err:
        rb = DivOPDReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=threshold,
                                max_off_policy_strategy=strategy, sampler_kwargs=kwargs)
        rb._ensure_sampler(8)
    assert "\n" not in str(err.value)
