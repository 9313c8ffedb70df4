"""DivOPD's Trinity-RFT sample strategy on Trinity's real experience queue: written with Trinity's writer, read by
the strategy through Trinity's reader, under a local Ray. The turn stream is a real divopd experience log."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trinity.algorithm.sample_strategy")

import torch  # noqa: E402
from opd_stream import SETTINGS, UPDATES, key_of, reference, rollout_ranks, to_experience  # noqa: E402
from queue_helpers import assert_ledger_identity, buffer_config, queue_writer, strategy  # noqa: E402
from trinity.common.experience import EID, Experience  # noqa: E402

from divopd.analysis.replay import ReplayConfig, replay  # noqa: E402
from divopd.errors import UsageError  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.integrations import trinity as trinity_strategy  # noqa: E402
from divopd.integrations.trinity import DivOPDSampleStrategy, default_sample_args  # noqa: E402
from divopd.sampling import METHODS, SamplerConfig, get_method  # noqa: E402
from divopd.sampling.gate import REASONS  # noqa: E402

#: every registered rule on the damaged stream (invalid records inside), two rules on the log as it was written
CASES = [(m, True) for m in sorted(METHODS)] + [("divopd", False), ("vanilla", False)]


@pytest.mark.parametrize(("method", "damaged"), CASES, ids=[f"{m}{'-damaged' if d else ''}" for m, d in CASES])
def test_the_strategy_selects_what_divopd_replay_selects(ray_local, divopd_log: Path, tmp_path: Path, method: str,
                                                         damaged: bool) -> None:
    asyncio.run(_replay_through_trinity(divopd_log, tmp_path, method, damaged))


async def _replay_through_trinity(log: Path, tmp_path: Path, method: str, damaged: bool) -> None:
    config = SamplerConfig(method, seed=0, **SETTINGS)
    ticks, _ = reference(log, config, UPDATES, damaged)
    assert all(t.selected is not None for t in ticks), "the replay starves on an update: no batch to compare"
    logged = list(read_log(log))
    if damaged:
        from opd_stream import damage

        logged = [lt._replace(turn=damage(lt.turn, lt.arrival)) for lt in logged]
    replayed = replay(logged, ReplayConfig(methods=(method,), updates=UPDATES, seed=0, **SETTINGS))
    series = replayed["methods"][method]["series"]
    assert series["batch"] == [1] * UPDATES
    ranks = rollout_ranks(log)
    buffer = buffer_config(tmp_path, config.batch_size)
    async with queue_writer(buffer) as writer:
        plugin = strategy(buffer, method=method, **SETTINGS)
        for tick in ticks:
            if tick.delivered:  # the explorer side writes what arrived before this update, in arrival order
                await writer.write([to_experience(t, ranks[t.rollout_id]) for t in tick.delivered])
            if tick.update == UPDATES // 2:  # a checkpoint mid-stream: JSON, as Trinity writes it, into a new strategy
                state = json.loads(json.dumps(plugin.state_dict()))
                plugin = strategy(buffer, method=method, **SETTINGS)
                plugin.load_state_dict(state)
            batch, metrics, samples = await plugin.sample(tick.update + 1)
            assert [key_of(e) for e in batch] == tick.selected, f"update {tick.update}"
            ledger = plugin.sampler.ledger
            assert_ledger_identity(ledger)
            # what reached the pool is counted exactly as the replay counts it; the rest may still sit in Trinity
            for key in ("selected", "invalid", "pending", "invalid_by_reason"):
                assert getattr(ledger, key) == getattr(tick.ledger, key), (key, tick.update)
            assert ledger.expired <= tick.ledger.expired
            assert plugin.held == plugin.sampler.waiting <= config.pool_size
            j = tick.update
            assert metrics["sampler/effective_rollouts"] == pytest.approx(series["effective_rollouts"][j])
            assert (metrics["ledger/selected"], metrics["ledger/invalid"]) == (series["selected"][j],
                                                                               series["invalid"][j])
            assert metrics["sample/model_version/max"] <= j and samples
    final = ticks[-1].ledger
    assert final.expired_by_reason["stale"] > 0  # the stream does exercise staleness ...
    rule = get_method(method)
    assert (final.invalid > 0) == (damaged and rule.pooled and rule.gated)  # ... and, damaged, the gate


def _experience(rollout: int, step: int, version: int | None, n: int = 3, **over) -> Experience:
    fields = {
        "eid": EID(batch=0, task=rollout, run=0, step=step), "tokens": torch.arange(5 + n), "prompt_length": 5,
        "logprobs": torch.full((n,), -1.0), "teacher_logprobs": torch.full((n,), -2.0 - step),
        "action_mask": torch.ones(n, dtype=torch.bool), "info": {} if version is None else {"model_version": version},
    }
    return Experience(**{**fields, **over})


def test_stale_and_invalid_records_are_counted_as_such(ray_local, tmp_path: Path) -> None:
    async def run() -> None:
        buffer = buffer_config(tmp_path, 4)
        async with queue_writer(buffer) as writer:
            plugin = strategy(buffer, method="divopd", pool_factor=3, cap=2, max_staleness=1)
            invalid = {  # one record per gate reason, at a fresh version
                "prompt_truncated": _experience(10, 0, 4, truncate_status="prompt_truncated"),
                "empty_response": _experience(11, 0, 4, n=0),
                "missing_teacher": _experience(12, 0, 4, teacher_logprobs=None),
                "missing_student_logprobs": _experience(13, 0, 4, logprobs=None),
                "length_mismatch": _experience(14, 0, 4, teacher_logprobs=torch.full((2,), -2.0)),
                "no_valid_token": _experience(15, 0, 4, action_mask=torch.zeros(3, dtype=torch.bool)),
            }
            assert list(invalid) == list(REASONS)
            stale = [_experience(1, t, 2) for t in range(3)]  # learner version 4 - 2 > max_staleness 1
            valid = [_experience(r, t, 3 + t % 2) for r in range(2, 4) for t in range(3)]
            await writer.write(stale + list(invalid.values()) + valid)
            batch, metrics, _ = await plugin.sample(5)
            assert len(batch) == 4 and all(e.info["model_version"] >= 3 for e in batch)
            ledger = plugin.sampler.ledger
            assert_ledger_identity(ledger)
            assert ledger.expired_by_reason["stale"] == metrics["ledger/expired/stale"] == 3
            assert ledger.invalid_by_reason == dict.fromkeys(REASONS, 1)
            assert all(metrics[f"ledger/invalid/{r}"] == 1 for r in REASONS)
            assert (ledger.received, ledger.selected, ledger.pending) == (15, 4, 2)
            assert plugin.held == 2  # the experiences of expired and rejected turns are not kept

    asyncio.run(run())


def _content(exp: Experience) -> tuple:
    tensors = (exp.tokens, exp.logprobs, exp.teacher_logprobs, exp.action_mask)
    return exp.eid.task, exp.eid.step, exp.info, exp.truncate_status, *(str(t.tolist()) for t in tensors)


def test_records_stay_in_the_queue_actor_until_selected_and_change_nothing(ray_local, tmp_path: Path) -> None:
    """The queue actor keeps each record it reads until the record is selected (only its identity and response arrays
    come back) and drops there a record that is stale at the step it is read for (only its header comes back). The
    batches, their experiences, the ledger, the arrival numbers and the checkpoint are those of reading every record
    in full (as the strategy does when the experience log needs every turn's arrays); the actor holds exactly the
    records still waiting and those that left unselected since the last hand-over."""

    def in_actor(storage: Any) -> list[int]:  # a closure: Ray ships it by value
        return sorted(storage.__dict__.get("_divopd_kept", {}))

    async def run(keep: bool) -> tuple[list, list, dict, list[int]]:
        buffer = buffer_config(tmp_path, 4)
        async with queue_writer(buffer) as writer:
            plugin = strategy(buffer, method="divopd", pool_factor=2, cap=2, max_staleness=1)
            assert plugin.keep_in_queue
            plugin.keep_in_queue = keep
            counts, read_now = [0, 0, 0], plugin._read_now

            async def spy(limit: int, learner_version: int) -> tuple:
                read, experiences, drained = await read_now(limit, learner_version)
                for i, n in enumerate((len(read.stale), len(read.kept), len(experiences))):
                    counts[i] += n
                return read, experiences, drained

            plugin._read_now = spy
            batches, ledgers = [], []
            for step in range(1, 6):  # every other rollout 3 versions old (stale), one with no valid token
                old = [_experience(10 * step, t, max(step - 4, 0)) for t in range(3)] if step > 2 else []
                new = [_experience(10 * step + 1, t, step - 1) for t in range(3)]
                dead = [_experience(10 * step + 2, 0, step - 1, action_mask=torch.zeros(3, dtype=torch.bool))]
                unscored = _experience(10 * step + 4, 0, step - 1)
                unscored.info["divopd_unscored"] = True  # read whole: the gate rejects it
                new[1].teacher_logprobs = torch.tensor([float("nan"), -2.0, -3.0])  # masked at hand-over
                await writer.write(old + new + dead + [_experience(10 * step + 3, 0, step - 1), unscored])
                batch, metrics, _ = await plugin.sample(step)
                batches.append([_content(exp) for exp in batch])
                ledger = plugin.sampler.ledger
                assert_ledger_identity(ledger)
                ledgers.append((ledger, metrics["sampler/expired"], plugin.sampler.ledger.received))
                waiting = [key for key, _ in plugin.sampler.waiting_payloads() if type(key) is int]
                assert await plugin._reader.queue.__ray_call__.remote(in_actor) == sorted(waiting + plugin._release)
            state = plugin.state_dict()["sampler"]
            for entry in state["queue"] + state["pending"]:  # the experience in content (eid has a random suffix)
                entry[2] = (_content(Experience.deserialize_many(base64.b64decode(entry[2][0]))[0]), entry[2][1])
            return batches, ledgers, state, counts

    kept, ledgers_kept, state_kept, (stale, light, whole) = asyncio.run(run(True))
    read, ledgers_read, state_read, (stale_read, light_read, whole_read) = asyncio.run(run(False))
    assert kept == read and ledgers_kept == ledgers_read and state_kept == state_read
    assert ledgers_kept[-1][0].expired_by_reason["stale"] > 0 and ledgers_kept[-1][0].invalid > 0
    assert stale > 0 and light > 0 and whole == 5  # the unscored records
    assert stale_read == light_read == 0 and whole_read == stale + light + whole


@pytest.mark.parametrize(("record", "field"), [
    ({"info": {}}, "model_version"),
    ({"info": {"model_version": "3"}}, "model_version"),
    ({"eid": EID(run=0, step=1)}, "rollout id"),
    ({"eid": EID(batch=0, task=1, run=0, step=-1)}, "turn_index"),
])
def test_a_record_without_identity_or_version_stops_with_one_line(ray_local, tmp_path: Path, record: dict,
                                                                   field: str) -> None:
    async def run() -> None:
        buffer = buffer_config(tmp_path, 2)
        buffer.cache_dir = str(tmp_path / "cache")  # Trinity sets it to <checkpoint job dir>/buffer
        async with queue_writer(buffer) as writer:
            plugin = strategy(buffer, method="divopd")
            await writer.write([_experience(0, 0, 0), _experience(0, 1, 0, **record)])
            with pytest.raises(UsageError, match=field) as err:
                await plugin.sample(1)
            assert "\n" not in str(err.value) and plugin.sampler.ledger.received < 2  # the bad record is not queued
            # ... but counted and kept: in the strategy, and in a file beside Trinity's buffer
            assert "1 record(s) stopped the run" in str(err.value) and len(plugin.stopped) == 1
            assert plugin.sampler.ledger.received == 1  # the valid record read with it is queued, not lost
            kept = list(tmp_path.glob("cache/divopd-stopped-records-*.bin"))
            assert len(kept) == 1 and str(kept[0]) in str(err.value)
            written = Experience.deserialize_many(kept[0].read_bytes())
            assert [str(e.eid) for e in written] == [str(plugin.stopped[0].eid)]

    asyncio.run(run())


def test_bad_strategy_settings_are_one_line_each(ray_local, tmp_path: Path) -> None:
    buffer = buffer_config(tmp_path, 8)
    cases = [({"methd": "divopd"}, "unknown key 'methd'"), ({"method": "fancy"}, "unknown sampler method"),
             ({"cap": 0}, "cap"), ({"pool_factor": 0.5}, "pool_factor")]
    for args, message in cases:
        with pytest.raises(UsageError, match=message) as err:
            strategy(buffer, **args)
        assert "\n" not in str(err.value)
    file_buffer = buffer_config(tmp_path, 8)
    file_buffer.trainer_input.experience_buffer.storage_type = "file"
    with pytest.raises(UsageError, match="storage_type to queue"):
        strategy(file_buffer)
    replaying = buffer_config(tmp_path, 8)
    replaying.trainer_input.experience_buffer.replay_buffer.enable = True
    with pytest.raises(UsageError, match="replay_buffer.enable"):
        strategy(replaying)


def test_defaults_are_the_papers_and_batch_size_is_trinitys(ray_local, tmp_path: Path) -> None:
    args = DivOPDSampleStrategy.default_args()
    assert args == default_sample_args()
    assert (args["method"], args["pool_factor"], args["cap"], args["max_staleness"], args["max_pending_age"]) == (
        "divopd", 4, 4, 2, 8)
    plugin = strategy(buffer_config(tmp_path, 96))
    assert plugin.config == SamplerConfig("divopd", batch_size=96)


def test_a_step_counts_and_reads_the_queue_in_one_request(ray_local, tmp_path: Path) -> None:
    """While the pool is not full, a step asks the queue actor once: it counts what the queue holds and reads it
    with Trinity's own ``get_batch`` on the actor's event loop (Trinity's reader is not called). Where that loop is
    not found, the strategy counts and then reads with Trinity's reader; both select the same batches."""

    def no_loop(storage: Any) -> None:  # as if the actor's event loop could not be found
        storage.__dict__["_divopd_event_loop"] = False

    async def run(find_loop: bool) -> tuple[list, list]:
        buffer = buffer_config(tmp_path, 4)
        async with queue_writer(buffer) as writer:
            plugin = strategy(buffer, method="divopd", pool_factor=3, cap=2, max_staleness=1)
            if not find_loop:
                await plugin._reader.queue.__ray_call__.remote(no_loop)
            reads, read = [], plugin._reader.read

            async def spy(batch_size: int | None = None, **kwargs: Any) -> list[Experience]:
                reads.append(batch_size)
                return await read(batch_size, **kwargs)

            plugin._reader.read = spy
            keys = []
            for step in range(1, 5):  # 6 records a step: the pool of 12 is not full before step 3
                await writer.write([_experience(10 * step + r, t, step - 1) for r in range(2) for t in range(3)])
                batch, _, _ = await plugin.sample(step)
                keys.append([(e.eid.task, e.eid.step) for e in batch])
                assert_ledger_identity(plugin.sampler.ledger)
            return keys, reads

    one, reads_one = asyncio.run(run(True))
    two, reads_two = asyncio.run(run(False))
    assert one == two and all(len(k) == 4 for k in one)
    assert reads_one == [] and reads_two == [6, 6, 6, 6]


def test_a_queue_actor_that_lost_the_kept_records_stops_the_run(ray_local, tmp_path: Path) -> None:
    """Records read into the pool stay in the queue actor; if it no longer holds them (restarted under the strategy),
    the hand-over stops with an error saying how many, instead of training on fewer."""

    def forget(storage: Any) -> int:  # as a restarted actor: nothing kept
        kept = storage.__dict__.pop("_divopd_kept", {})
        return len(kept)

    async def run() -> None:
        buffer = buffer_config(tmp_path, 4)
        async with queue_writer(buffer) as writer:
            plugin = strategy(buffer, method="divopd", pool_factor=2, cap=2, max_staleness=1)
            await writer.write([_experience(r, t, 0) for r in range(4) for t in range(3)])
            batch, _, _ = await plugin.sample(1)
            assert len(batch) == 4
            assert await plugin._reader.queue.__ray_call__.remote(forget) == plugin.sampler.waiting > 0
            with pytest.raises(RuntimeError, match=r"no longer holds [1-4] of the records read into the pool"):
                await plugin.sample(2)

    asyncio.run(run())


def test_a_queue_actor_that_does_not_answer_stops_the_step_at_its_deadline(ray_local, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A request to the queue actor that gets no answer within ``max_read_timeout`` + ``CALL_SLACK_S`` stops the step
    (and a checkpoint's copy of the waiting records) with one TimeoutError line naming the request."""
    monkeypatch.setattr(trinity_strategy, "CALL_SLACK_S", 2.0)

    def slow(function: Any) -> Any:
        def call(storage: Any, *args: Any) -> Any:  # a closure: Ray ships it by value
            import time

            time.sleep(6.0)
            return function(storage, *args)

        return call

    async def run() -> None:
        buffer = buffer_config(tmp_path, 4, max_read_timeout=0.5)
        async with queue_writer(buffer) as writer:
            plugin = strategy(buffer, method="divopd", pool_factor=2, cap=2, max_staleness=1)
            await writer.write([_experience(r, t, 0) for r in range(4) for t in range(3)])
            assert len((await plugin.sample(1))[0]) == 4
            plugin._fetch_fn = slow(plugin._fetch_fn)
            with pytest.raises(TimeoutError, match=r"did not answer copying the waiting records .* within 2.5 s"):
                plugin.state_dict()
            await asyncio.sleep(6.0)  # the actor answers one request at a time: let the late copy end
            with pytest.raises(TimeoutError, match=r"did not answer the hand-over of the selected .* within 2.5 s"):
                await plugin.sample(2)

    asyncio.run(run())
