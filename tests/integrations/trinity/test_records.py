"""Each Trinity ``Experience`` becomes the divopd ``Turn`` it stands for: what the gate and the rules read survives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trinity.algorithm.sample_strategy")

import torch  # noqa: E402
from opd_stream import rollout_ranks, to_experience  # noqa: E402
from trinity.common.experience import EID, Experience  # noqa: E402

from divopd.experience.log import read_log  # noqa: E402
from divopd.integrations.trinity import experience_to_turn  # noqa: E402
from divopd.sampling import gate  # noqa: E402


def test_a_logged_turn_survives_the_trip_through_an_experience(divopd_log: Path) -> None:
    ranks = rollout_ranks(divopd_log)
    logged = list(read_log(divopd_log))
    for lt in logged:
        original = lt.turn
        written = to_experience(original, ranks[original.rollout_id])
        exp = Experience.deserialize_many(Experience.serialize_many([written]))[0]  # as it leaves Trinity's queue
        turn = experience_to_turn(exp)
        assert turn.rollout_id == f"log/{ranks[original.rollout_id]:06d}/0" == exp.eid.rid
        assert (turn.turn_index, turn.policy_version) == (original.turn_index, original.policy_version)
        np.testing.assert_array_equal(turn.prompt_ids, original.prompt_ids)
        np.testing.assert_array_equal(turn.response_ids, original.response_ids)
        np.testing.assert_array_equal(turn.student_logprobs, original.student_logprobs)
        assert turn.n_valid == original.n_valid and gate.check(turn) == gate.check(original)
        assert turn.disagreement == pytest.approx(original.disagreement)
        assert turn.info["task"] == original.info["task"]
    assert len({lt.turn.rollout_id for lt in logged}) == len(ranks) > 1


def test_bfloat16_log_probs_and_unscored_positions() -> None:
    exp = Experience(eid=EID(batch=3, task=7, run=1, step=2), tokens=torch.arange(9), prompt_length=6,
                     logprobs=torch.tensor([-1.0, -2.0, -0.5], dtype=torch.bfloat16),
                     teacher_logprobs=torch.tensor([-1.5, float("nan"), -0.25]),
                     action_mask=torch.tensor([True, True, False]), info={"model_version": 4})
    turn = experience_to_turn(exp)
    assert (turn.rollout_id, turn.turn_index, turn.policy_version, turn.info["task"]) == ("3/7/1", 2, 4, "3/7")
    assert turn.student_logprobs.dtype == np.float32 and turn.n_valid == 1  # NaN: not scored; mask: not an action
    assert turn.disagreement == pytest.approx(0.5)
