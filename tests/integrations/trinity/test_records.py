"""Each Trinity ``Experience`` becomes the divopd ``Turn`` it stands for: what the gate and the rules read survives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trinity.algorithm.sample_strategy")

import torch  # noqa: E402
from opd_stream import rollout_ranks, to_experience  # noqa: E402
from trinity.common.experience import EID, Experience  # noqa: E402

from divopd.errors import UsageError  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.integrations.trinity import experience_to_turn  # noqa: E402
from divopd.integrations.trinity_queue import pack_function, unpack  # noqa: E402
from divopd.integrations.trinity_records import read_candidates  # noqa: E402
from divopd.sampling import Candidate, gate  # noqa: E402


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


def test_a_whole_read_gets_the_candidate_each_record_gives_alone() -> None:
    """:func:`read_candidates` computes the gate and focus values of a whole read at once: each candidate equals the
    one of the record's own :class:`Turn`, disagreement exactly (NaN teacher positions, non-action tokens, a
    non-finite student log prob, lengths 1..20, a mismatch, a record that stops the run)."""
    rng = np.random.default_rng(3)
    exps = []
    for i in range(60):
        n = int(rng.integers(1, 21))
        student = -rng.exponential(1.0, n).astype(np.float32)
        teacher = student - rng.exponential(0.5, n).astype(np.float32)
        teacher[rng.random(n) < 0.2] = np.nan
        student[rng.random(n) < 0.05] = -np.inf
        mask = rng.random(n) < 0.8
        if i == 7:
            teacher = teacher[:-1] if n > 1 else np.zeros(2, np.float32)  # length mismatch: Turn's own path
        exps.append(Experience(eid=EID(batch=0, task=i, run=0, step=0), tokens=torch.arange(5 + n), prompt_length=5,
                               logprobs=torch.from_numpy(student), teacher_logprobs=torch.from_numpy(teacher),
                               action_mask=torch.from_numpy(mask), info={"model_version": 1}))
    exps.append(Experience(eid=EID(batch=0, task=99, run=0, step=0), tokens=torch.arange(8), prompt_length=5,
                           info={}))  # no version: stops the run
    read, _ = read_candidates(exps)
    assert isinstance(read[-1], UsageError)
    for exp, candidate in zip(exps[:-1], read[:-1], strict=True):
        assert candidate == Candidate.of(experience_to_turn(exp))  # disagreement exactly: the rules rank by it
    assert sum(c.n_valid > 0 for c in read[:-1]) > 40 and sum(c.reason == "length_mismatch" for c in read[:-1]) == 1


def test_the_fast_read_gives_the_candidate_each_record_gives_alone() -> None:
    """The fast path of :func:`read_candidates` (one concatenation per field for the whole read) gives each record
    the candidate of its own :class:`Turn`, for bf16 / fp16 / fp64 log probs, int32 tokens, a recorded task and
    outcome, a truncated prompt, records that take the per-record path (a non-bool mask, an empty response, the
    unscored flag) mixed into the same read; and the per-record flag of a teacher position that is not finite."""
    rng = np.random.default_rng(5)
    exps = []
    for i in range(40):
        n = int(rng.integers(1, 12))
        student = torch.from_numpy(-rng.exponential(1.0, n)).to([torch.float32, torch.bfloat16, torch.float16,
                                                                   torch.float64][i % 4])
        teacher = torch.from_numpy((-rng.exponential(1.0, n)).astype(np.float32))
        if i % 5 == 0:
            teacher[0] = float("nan")
        mask = torch.from_numpy(rng.random(n) < 0.8)
        info = {"model_version": i % 3}
        if i % 6 == 1:
            info.update(task="sciworld/3", success=1)
        if i % 7 == 2:
            info["divopd_policy_version"] = 9
        tokens = torch.arange(4 + n, dtype=torch.int32 if i % 2 else torch.int64)
        exps.append(Experience(eid=EID(batch=1, task=i // 3, run=i % 3, step=i % 4), tokens=tokens, prompt_length=4,
                               logprobs=student, teacher_logprobs=teacher, action_mask=mask, info=info,
                               truncate_status="prompt_truncated" if i == 11 else None))
    exps[13].action_mask = exps[13].action_mask.int()  # not bool: the per-record path
    exps[17].info["divopd_unscored"] = True  # flagged unscored: the per-record path
    exps[19].tokens, exps[19].prompt_length = exps[19].tokens[:4], 4  # empty response: the per-record path
    read, unscored = read_candidates(exps)
    for exp, candidate, flag in zip(exps, read, unscored, strict=True):
        alone = experience_to_turn(exp)
        assert candidate == Candidate.of(alone), exp.eid
        assert flag == (alone.teacher_logprobs is not None and not np.isfinite(alone.teacher_logprobs).all())
    assert sum(unscored) >= 7 and sum(c.reason is None for c in read) > 20
    assert {c.reason for c in read} >= {None, "prompt_truncated", "empty_response", "missing_teacher"}


def test_a_packed_transfer_gives_back_equal_experiences() -> None:
    """The queue actor's transfer (:func:`pack_function`, :func:`unpack`) gives back each experience equal field by
    field to Trinity's own ``serialize_many`` round trip: every tensor field set or not, mixed dtypes within a record,
    2-d tensors, rewards, info, metrics, messages and texts; records with multi-modal inputs or custom fields, or a
    field whose dtype differs between records, go through Trinity's ``serialize_many`` itself."""
    rng = np.random.default_rng(3)

    def record(i: int) -> Experience:
        n = 2 + i % 5
        exp = Experience(eid=EID(batch=2, task=i, run=i % 2, step=i % 3), tokens=torch.arange(3 + n),
                         prompt_length=3, logprobs=torch.from_numpy(-rng.exponential(1.0, n).astype(np.float32)),
                         reward=None if i % 4 == 0 else float(i), info={"model_version": i, "task": f"t{i}"},
                         metrics={"turns": float(i)}, response_text=f"r{i}",
                         messages=[{"role": "user", "content": "x"}],
                         truncate_status="response_truncated" if i == 3 else None)
        if i % 3:
            exp.teacher_logprobs = torch.full((n,), -1.5)
            exp.action_mask = torch.from_numpy(rng.random(n) < 0.5)
        if i % 2:
            exp.advantages = torch.ones(n) * i
            exp.routed_experts = torch.zeros((n, 2, 3), dtype=torch.int32)
        return exp

    def fields(exp: Experience) -> dict:
        out = {name: getattr(exp, name) for name in Experience._META_FIELDS}
        out["eid"] = exp.eid.to_dict()
        for name in Experience._TENSOR_FIELDS:
            value = getattr(exp, name)
            out[name] = None if value is None else (value.dtype, tuple(value.shape), value.tolist())
        return out

    pack = pack_function()
    exps = [record(i) for i in range(12)]
    mixed = [record(i) for i in range(4)]
    mixed[2].logprobs = mixed[2].logprobs.to(torch.bfloat16)
    multi = [record(i) for i in range(3)]
    multi[1].multi_modal_inputs = {"pixel_values": torch.ones(2, 2)}
    for batch, how in ((exps, "columns"), (mixed, "trinity"), (multi, "trinity")):
        packed = pack(batch)
        assert packed[0] == how
        trinity = Experience.deserialize_many(Experience.serialize_many(batch))
        assert [fields(e) for e in unpack(packed)] == [fields(e) for e in trinity] == [fields(e) for e in batch]
