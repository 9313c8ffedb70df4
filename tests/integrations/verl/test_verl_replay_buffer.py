"""DivOPDReplayBuffer against verl's real replay-buffer machinery: a real TransferQueue on a CPU.

The turn stream is a real divopd experience log (a lockstep ``divopd train`` run, data/tiny-lockstep) with some
records damaged, put into TransferQueue as verl records tick by tick the way ``divopd replay`` delivers it. Update by
update the plug-in must select exactly the turns replay's sampler selects, report the same ledger as ``divopd replay``
and keep the ledger identity; a state round trip mid-stream must give the same next batches; stale and invalid records
must be counted as such and cleared from TransferQueue.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import transfer_queue as tq  # noqa: E402
from verl_helpers import (  # noqa: E402
    clear_partition,
    ledger_identity,
    make_buffer,
    new_partition,
    prompt_keys,
    put_turns,
    reference_batches,
    replay_config,
    stream_log,
    ticks,
    trajectory_keys,
)

from divopd.analysis.replay import replay  # noqa: E402
from divopd.experience import Turn  # noqa: E402
from divopd.integrations.verl import DivOPDReplayBuffer, VerlRecordError  # noqa: E402
from divopd.integrations.verl_records import parse_key  # noqa: E402
from divopd.sampling import get_method  # noqa: E402

B = 6


def _drive(rb: DivOPDReplayBuffer, partition: str, log_ticks: list[list[Turn]], start: int = 0, stop: int | None = None,
           ) -> list[tuple[list[tuple[str, int]] | None, dict]]:
    """Ticks start..stop: put the tick's records (and a finished prompt marker), sample once at global step j + 1
    (learner version j), then clear the batch from TransferQueue as verl's trainer does after its update."""
    out = []
    for j in range(start, len(log_ticks) if stop is None else stop):
        put_turns(partition, log_ticks[j], prompt_uid=f"p{j}")
        batch, metrics = rb.sample_nowait(global_steps=j + 1, partition_id=partition, batch_size=B)
        assert ledger_identity(rb.sampler.ledger), (j, rb.sampler.ledger)
        assert not prompt_keys(partition), "terminal prompt markers are cleared once their records are read"
        if batch is not None:
            assert len(batch.keys) == len(batch.tags) == B
            # what verl's trainer reads next, then clears after its update
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses"])
            assert data.batch_size[0] == B
            tq.kv_clear(keys=batch.keys, partition_id=partition)
        waiting = rb.sampler.ledger.pending + rb.sampler.ledger.queued
        assert trajectory_keys(partition) == rb.waiting_keys() and len(rb.waiting_keys()) == waiting, j  # no leak
        out.append((None if batch is None else [parse_key(k) for k in batch.keys], metrics))
    return out


@pytest.mark.parametrize("method", ["vanilla", "divopd-base", "divopd", "divopd-focus"])
def test_selects_what_divopd_replay_selects_update_by_update(transfer_queue, tmp_path, method: str) -> None:
    log = stream_log(tmp_path)
    expected = reference_batches(log, method)
    report = replay(log, replay_config(method))["methods"][method]
    partition = new_partition()
    rb = make_buffer(method)
    try:
        got = _drive(rb, partition, ticks(log))
    finally:
        clear_partition(partition)
    assert [keys for keys, _ in got] == expected
    series = report["series"]
    for j, (keys, metrics) in enumerate(got):
        for name in ("selected", "expired", "invalid"):
            assert metrics[f"ledger/{name}"] == series[name][j], (method, j, name)
        if keys is not None:
            assert metrics["sampler/effective_rollouts"] == pytest.approx(series["effective_rollouts"][j])
            assert metrics["sampler/rows"] == B
    ledger = rb.sampler.ledger
    assert asdict(ledger) == report["ledger"]
    assert ledger.expired_by_reason["stale"] > 0
    if get_method(method).pooled and get_method(method).gated:  # ungated rules train on them (dead rows), as replay
        assert ledger.invalid_by_reason["missing_teacher"] > 0
        assert ledger.invalid_by_reason["missing_student_logprobs"] > 0


def test_a_state_round_trip_mid_stream_gives_the_same_next_batches(transfer_queue, tmp_path) -> None:
    log = stream_log(tmp_path)
    log_ticks = ticks(log)
    expected = reference_batches(log, "divopd")
    partition = new_partition()
    try:
        first = make_buffer("divopd")
        head = _drive(first, partition, log_ticks, stop=5)
        state = json.loads(json.dumps(first.state_dict()))  # JSON-able, as a checkpoint would hold it
        second = make_buffer("divopd")
        second.load_state_dict(state)
        assert second.sampler.ledger == first.sampler.ledger
        tail = _drive(second, partition, log_ticks, start=5)
    finally:
        clear_partition(partition)
    assert [keys for keys, _ in head + tail] == expected


def test_stale_and_invalid_records_are_counted_and_cleared(transfer_queue) -> None:
    partition = new_partition()
    rb = make_buffer("divopd", max_pending_age=None)

    def turn(rid: str, index: int, version: int, n: int = 3, **over: object) -> Turn:
        data = dict(rollout_id=rid, turn_index=index, policy_version=version, prompt_ids=[1, 2],
                    response_ids=list(range(3, 3 + n)), student_logprobs=[-1.0] * n, teacher_logprobs=[-2.0] * n)
        data.update(over)
        return Turn(**data)

    try:
        put_turns(partition, [turn("old", 0, 0), turn("old", 1, 0)])  # stale at global step 5 (version 4, δ = 1)
        put_turns(partition, [turn("nt", 0, 4, teacher_logprobs=None), turn("ns", 0, 4, student_logprobs=None),
                              turn("mm", 0, 4, action_mask=[1, 1])])  # lengths 3 vs 2
        put_turns(partition, [turn(f"ok{i}", 0, 4) for i in range(B - 1)])  # one short of a batch
        batch, metrics = rb.sample_nowait(global_steps=5, partition_id=partition, batch_size=B)
        assert batch is None
        assert metrics["ledger/expired/stale"] == 2
        assert metrics["ledger/invalid/missing_teacher"] == 1
        assert metrics["ledger/invalid/missing_student_logprobs"] == 1
        assert metrics["ledger/invalid/length_mismatch"] == 1
        assert metrics["ledger/pending"] == B - 1 and ledger_identity(rb.sampler.ledger)
        assert trajectory_keys(partition) == {f"ok{i}_0" for i in range(B - 1)}  # rejected records are cleared
        put_turns(partition, [turn("late", 0, 4)])
        batch, metrics = rb.sample_nowait(global_steps=5, partition_id=partition, batch_size=B)
        assert sorted(batch.keys) == sorted([f"ok{i}_0" for i in range(B - 1)] + ["late_0"])
        assert metrics["ledger/selected"] == B and metrics["sampler/rows"] == B
    finally:
        clear_partition(partition)


@pytest.mark.parametrize(("key", "tag", "field"), [
    ("no-turn-index", {"status": "success", "min_global_steps": 0}, "turn index"),
    ("r_0", {"status": "success"}, "min_global_steps"),
])
def test_a_record_the_composer_cannot_place_stops_with_one_line(transfer_queue, key: str, tag: dict,
                                                                  field: str) -> None:
    import torch

    partition = new_partition()
    rb = make_buffer("divopd")
    try:
        tq.kv_put(key=key, partition_id=partition, tag=tag,
                  fields={"prompts": torch.tensor([1]), "responses": torch.tensor([2])})
        with pytest.raises(VerlRecordError, match=field) as err:
            rb.sample_nowait(global_steps=1, partition_id=partition, batch_size=B)
        assert "\n" not in str(err.value) and key in str(err.value)
    finally:
        clear_partition(partition)
