"""Records in both teacher layouts in one read, and records that stop the run, through the real TransferQueue.

A TransferQueue read of a field whose records differ in rank (verl's ``[P + R, K]`` teacher rows beside a user's one
value per token) comes back as TransferQueue's ``LinkedList``, not a tensor: the plug-in must read it row by row
(the old code raised ``AttributeError: 'LinkedList' object has no attribute 'unbind'``). A record the composer cannot
place stops the run with one line; it is counted (``DivOPDReplayBuffer.stopped``) and stays in TransferQueue, with
the records read beside it (none of them entered the sampler).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import torch  # noqa: E402
import transfer_queue as tq  # noqa: E402
from verl_helpers import (  # noqa: E402
    clear_partition,
    ledger_identity,
    make_buffer,
    new_partition,
    trajectory_keys,
    turn_to_record,
)

from divopd.experience import Turn  # noqa: E402
from divopd.integrations.verl import VerlRecordError  # noqa: E402

N = 4  # response tokens per turn


def _turn(rid: str, teacher: list[float]) -> Turn:
    return Turn(rollout_id=rid, turn_index=0, policy_version=0, prompt_ids=[1, 2, 3], response_ids=[4, 5, 6, 7],
                student_logprobs=[-1.0] * N, teacher_logprobs=teacher)


def _put(partition: str, turn: Turn, layout: str) -> str:
    """A record without divopd's summary tag (as a user's own agent loop writes it), teacher in ``layout``."""
    key, fields, tag = turn_to_record(turn)
    tag.pop("divopd", None)  # divopd's summary tag
    if layout == "per_token":  # one value per response token, no teacher_ids
        fields.pop("teacher_ids")
        fields["teacher_logprobs"] = torch.tensor(turn.teacher_logprobs, dtype=torch.float32)
    tq.kv_put(key=key, partition_id=partition, fields=fields, tag=tag)
    return key


def test_records_mixing_both_teacher_layouts_are_read_and_handed_over_in_verls_layout(transfer_queue) -> None:
    partition = new_partition()
    teachers = {f"r{i}": [-0.5 - i, -1.0, -2.0 + 0.1 * i, -0.25] for i in range(6)}
    teachers["r5"][2] = math.nan  # one position the teacher did not score
    layouts = {rid: ("sequence" if i % 2 == 0 else "per_token") for i, rid in enumerate(teachers)}
    try:
        keys = {rid: _put(partition, _turn(rid, t), layouts[rid]) for rid, t in teachers.items()}
        rb = make_buffer("divopd", cap=1)
        batch, metrics = rb.sample_nowait(global_steps=1, partition_id=partition, batch_size=6)
        assert batch is not None and sorted(batch.keys) == sorted(keys.values())
        assert rb.sampler.ledger.invalid == 0 and ledger_identity(rb.sampler.ledger)
        assert metrics["sampler/teacher_masked_tokens"] == 1
        data = tq.kv_batch_get(keys=batch.keys, partition_id=partition,
                               select_fields=["teacher_logprobs", "teacher_ids", "response_mask"])
        rewritten = tq.kv_batch_get(keys=[keys["r5"]], partition_id=partition, select_fields=["loss_mask"])
        by_key = {k: i for i, k in enumerate(batch.keys)}
        for rid, teacher in teachers.items():
            i = by_key[keys[rid]]
            rows = data["teacher_logprobs"][i]
            assert tuple(rows.shape) == (3 + N, 1)  # every record now in verl's [P + R, K] layout
            assert torch.isfinite(rows).all()
            assert data["teacher_ids"][i][2:2 + N, 0].tolist() == [4, 5, 6, 7]  # row P - 1 + j scores token j
            for j, value in enumerate(teacher):
                if math.isnan(value):
                    assert rows[2 + j, 0].item() == -1.0  # the student's log prob: no disagreement there
                    assert data["response_mask"][i][j].item() == 0 and rewritten["loss_mask"][0][j].item() == 0
                else:
                    assert rows[2 + j, 0].item() == pytest.approx(value)
    finally:
        clear_partition(partition)


def test_a_record_that_stops_the_run_is_counted_and_kept_with_the_records_read_beside_it(transfer_queue) -> None:
    partition = new_partition()
    try:
        good = [_put(partition, _turn(f"g{i}", [-1.0] * N), "sequence") for i in range(3)]
        key, fields, tag = turn_to_record(_turn("bad", [-1.0] * N))
        tag.pop("divopd", None)
        del tag["min_global_steps"], tag["global_steps"], tag["max_global_steps"]  # no version
        tq.kv_put(key=key, partition_id=partition, fields=fields, tag=tag)
        rb = make_buffer("divopd", cap=1)
        with pytest.raises(VerlRecordError, match=r"no policy version.*1 record\(s\) stopped the run") as err:
            rb.sample_nowait(global_steps=1, partition_id=partition, batch_size=3)
        assert "\n" not in str(err.value) and key in str(err.value)
        assert rb.stopped == [key]
        assert trajectory_keys(partition) == {key, *good}  # nothing read out, nothing lost
        assert rb.sampler.ledger.received == 0
        with pytest.raises(VerlRecordError):  # a rerun of the step stops again, and counts the record once
            rb.sample_nowait(global_steps=1, partition_id=partition, batch_size=3)
        assert rb.stopped == [key]
        tq.kv_clear(keys=[key], partition_id=partition)  # the user removes it: the others train
        batch, _ = rb.sample_nowait(global_steps=1, partition_id=partition, batch_size=3)
        assert sorted(batch.keys) == sorted(good)
    finally:
        clear_partition(partition)
