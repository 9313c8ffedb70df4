"""The strategy's experience log (``sample_strategy_args.experience_dir``) and its dispatch metrics: the log a Trinity
run writes is divopd's (``divopd replay DIR`` and ``divopd tune-cap DIR`` read it), replaying it with the same rule
and settings gives, update by update, the statistics the strategy reported, and each step reports the arrival ratio,
the sessions, the turns per session and the expired share. A fresh run refuses a directory that holds an earlier run's
log; a run Trinity resumes (its trainer state, saved and read by Trinity's own ``StateManager``) continues its log cut
back to the checkpoint, and the whole log still replays to what the two sessions reported."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trinity")

from opd_stream import SETTINGS, UPDATES, reference, rollout_ranks, to_experience  # noqa: E402
from queue_helpers import buffer_config, queue_writer, strategy  # noqa: E402
from trinity.manager.state_manager import StateManager  # noqa: E402

from divopd.analysis.replay import ReplayConfig, replay  # noqa: E402
from divopd.errors import UsageError  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.sampling import SamplerConfig  # noqa: E402

DISPATCH_KEYS = ("sampler/arrival_ratio", "sampler/sessions_started", "sampler/turns_per_session",
                 "sampler/expired_share")


async def _run(log: Path, tmp_path: Path, method: str, out: Path) -> list[dict]:
    """The strategy over the stream of ``log``, delivered tick by tick, writing its own log into ``out``."""
    ticks, _ = reference(log, SamplerConfig(method, seed=0, **SETTINGS), UPDATES)
    ranks = rollout_ranks(log)
    buffer = buffer_config(tmp_path, SETTINGS["batch_size"])
    steps = []
    async with queue_writer(buffer) as writer:
        plugin = strategy(buffer, method=method, experience_dir=str(out), **SETTINGS)
        for tick in ticks:
            if tick.delivered:
                await writer.write([to_experience(t, ranks[t.rollout_id]) for t in tick.delivered])
            _, metrics, _ = await plugin.sample(tick.update + 1)
            steps.append(metrics)
        plugin.state_dict()  # a checkpoint compacts the log's parts
    return steps


@pytest.mark.parametrize("method", ["divopd", "vanilla"])
def test_replaying_the_strategys_log_gives_the_statistics_it_reported(ray_local, divopd_log: Path, tmp_path: Path,
                                                                      method: str) -> None:
    out = tmp_path / "experience"
    steps = asyncio.run(_run(divopd_log, tmp_path, method, out))
    replayed = replay(out, ReplayConfig(methods=(method,), updates=UPDATES, seed=0, **SETTINGS))
    series = replayed["methods"][method]["series"]
    assert series["batch"] == [1] * UPDATES
    for j, metrics in enumerate(steps):
        assert metrics["sampler/effective_rollouts"] == pytest.approx(series["effective_rollouts"][j]), j
        assert (metrics["ledger/selected"], metrics["ledger/invalid"], metrics["ledger/expired"]) == (
            series["selected"][j], series["invalid"][j], series["expired"][j]), j
    logged = list(read_log(out))
    assert len(logged) == int(steps[-1]["ledger/received"])  # every turn the strategy received, once
    assert len(list(out.glob("part-*.parquet"))) == 1  # compacted at the checkpoint
    for verb in ("replay", "tune-cap"):  # the user's commands on the run's log
        done = subprocess.run([sys.executable, "-m", "divopd", verb, str(out), "--batch-size",
                               str(SETTINGS["batch_size"])], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (verb, done.stderr)


def test_each_step_reports_the_arrival_ratio_and_warns_when_out_of_band(ray_local, divopd_log: Path, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="divopd.integrations"):
        steps = asyncio.run(_run(divopd_log, tmp_path, "divopd", tmp_path / "experience"))
    for metrics in steps:
        assert all(key in metrics for key in DISPATCH_KEYS)
        assert 0 <= metrics["sampler/expired_share"] <= 1
    arrived = sum(m["sampler/arrival_ratio"] for m in steps) * SETTINGS["batch_size"]
    delivered = sum(len(t.delivered) for t in reference(divopd_log, SamplerConfig("divopd", seed=0, **SETTINGS),
                                                          UPDATES)[0])
    # what the strategy read, plus what it counted in Trinity's queue unread, up to all that was written
    assert steps[-1]["ledger/received"] <= round(arrived) <= delivered
    assert steps[-1]["sampler/turns_per_session"] > 1
    mean = sum(m["sampler/arrival_ratio"] for m in steps[1:4]) / 3
    band = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
    assert bool(band) == (not 1.0 <= mean <= 4.0), (mean, band)
    assert all("buffer.batch_size" in line and "\n" not in line for line in band)


def test_the_arrival_ratio_counts_each_steps_arrivals_at_that_step(ray_local, divopd_log: Path,
                                                                    tmp_path: Path) -> None:
    """Three batches' worth of turns arrive before each step and the pooled strategy reads only what its pool needs:
    the rest stays in Trinity's queue, and still counts as arrived at its own step (a ratio of 3 at every step), not
    later when a read happens to count the queue."""
    turns = [lt.turn for lt in read_log(divopd_log)]
    ranks = rollout_ranks(divopd_log)
    per_step, b = 3 * SETTINGS["batch_size"], SETTINGS["batch_size"]
    steps = min(5, len(turns) // per_step)

    async def go() -> list[float]:
        buffer = buffer_config(tmp_path, b)
        ratios = []
        async with queue_writer(buffer) as writer:
            plugin = strategy(buffer, method="divopd", **SETTINGS)
            plugin.load_state_dict({})
            for step in range(1, steps + 1):
                chunk = turns[(step - 1) * per_step:step * per_step]
                await writer.write([to_experience(dataclasses.replace(t, policy_version=step - 1), ranks[t.rollout_id])
                                    for t in chunk])
                _, metrics, _ = await plugin.sample(step)
                ratios.append(metrics["sampler/arrival_ratio"])
            assert plugin.sampler.ledger.received < steps * per_step  # some turns were left in the queue unread
        return ratios

    assert steps >= 3
    assert asyncio.run(go()) == [per_step / b] * steps


def test_a_bad_dispatch_setting_is_one_line(ray_local, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="target_arrival_ratio"):
        strategy(buffer_config(tmp_path, 8), target_arrival_ratio=0.5)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match="experience_dir"):
        strategy(buffer_config(tmp_path, 8), experience_dir=str(tmp_path / "a-file"))


async def _session(buffer, out: Path, method: str, ticks: list, ranks: dict, save_at: int | None = None,
                   state: StateManager | None = None) -> list[dict]:
    """One trainer session as Trinity's ``Trainer`` runs it: the strategy built through the registry, then given the
    trainer state's ``sample_strategy_state`` (``{}`` for a fresh run); the ticks delivered and sampled; the trainer
    state saved after step ``save_at`` (its checkpoint). Returns each step's metrics."""
    plugin = strategy(buffer, method=method, experience_dir=str(out), **SETTINGS)
    plugin.load_state_dict((state.load_trainer() if state else {}).get("sample_strategy_state", {}))
    steps = []
    async with queue_writer(buffer) as writer:
        for tick in ticks:
            if tick.delivered:
                await writer.write([to_experience(t, ranks[t.rollout_id]) for t in tick.delivered])
            _, metrics, _ = await plugin.sample(tick.update + 1)
            steps.append(metrics)
            if state is not None and tick.update + 1 == save_at:
                state.save_trainer(current_step=save_at, sample_strategy_state=plugin.state_dict())
    if save_at is None:
        plugin.state_dict()  # the run's last checkpoint (a session that dies after save_at writes none)
    return steps


def _job_buffer(tmp_path: Path) -> tuple:
    """A buffer config whose ``cache_dir`` is ``<job dir>/buffer``, as Trinity's config validator sets it, and the
    trainer's ``StateManager`` on that job dir."""
    job = tmp_path / "checkpoints" / "divopd" / "sw"
    buffer = buffer_config(tmp_path, SETTINGS["batch_size"])
    buffer.cache_dir = str(job / "buffer")
    return buffer, StateManager(path=str(job), trainer_name="trainer")


def test_a_rerun_into_the_same_experience_dir_is_refused_and_changes_nothing(ray_local, divopd_log: Path,
                                                                            tmp_path: Path) -> None:
    out = tmp_path / "runs" / "scienceworld-divopd" / "experience"
    asyncio.run(_run(divopd_log, tmp_path, "divopd", out))  # a run without Trinity's job dir: another run's log
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UsageError) as err:
        strategy(buffer_config(tmp_path, SETTINGS["batch_size"]), experience_dir=str(out))
    assert "\n" not in str(err.value) and str(out) in str(err.value)
    assert "give this run a new experience_dir, or remove" in str(err.value)
    buffer, state = _job_buffer(tmp_path)  # a run of a job dir that wrote no checkpoint: Trinity starts it afresh
    ticks, _ = reference(divopd_log, SamplerConfig("divopd", seed=0, **SETTINGS), 2)
    own = tmp_path / "own"
    asyncio.run(_session(buffer, own, "divopd", ticks, rollout_ranks(divopd_log)))
    own_before = {p.name: p.read_bytes() for p in own.iterdir()}
    plugin = strategy(buffer, experience_dir=str(own), **SETTINGS)
    with pytest.raises(UsageError, match="Trinity-RFT is not resuming that run from a checkpoint"):
        plugin.load_state_dict(state.load_trainer().get("sample_strategy_state", {}))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert {p.name: p.read_bytes() for p in own.iterdir()} == own_before


@pytest.mark.parametrize("method", ["divopd", "vanilla"])
def test_a_resumed_run_continues_its_log_and_replays_to_what_it_reported(ray_local, divopd_log: Path,
                                                                         tmp_path: Path, method: str) -> None:
    ticks, _ = reference(divopd_log, SamplerConfig(method, seed=0, **SETTINGS), UPDATES)
    ranks = rollout_ranks(divopd_log)
    out, ckpt = tmp_path / "experience", 4
    buffer, state = _job_buffer(tmp_path)
    # session 1: steps 1..6, Trinity's checkpoint after step 4, then the trainer dies (steps 5, 6 are lost)
    first = asyncio.run(_session(buffer, out, method, ticks[:ckpt + 2], ranks, save_at=ckpt, state=state))
    logged_first = list(read_log(out))
    # session 2 (Trinity resumes from step 4): the explorer delivers again what follows, steps 5..8
    buffer2 = buffer_config(tmp_path, SETTINGS["batch_size"])
    buffer2.cache_dir = buffer.cache_dir
    second = asyncio.run(_session(buffer2, out, method, ticks[ckpt:], ranks, state=state))
    logged = list(read_log(out))
    assert [x.arrival for x in logged] == list(range(len(logged)))  # one log, no gap, no repeat
    kept = int(first[ckpt - 1]["ledger/received"])  # what the checkpoint's sampler had received
    assert len(logged_first) > kept  # turns were logged past the checkpoint ...
    assert [x.turn.key for x in logged[:kept]] == [x.turn.key for x in logged_first[:kept]]  # ... and only they went
    assert len(logged) == int(second[-1]["ledger/received"])
    steps = first[:ckpt] + second
    series = replay(out, ReplayConfig(methods=(method,), updates=UPDATES, seed=0, **SETTINGS))["methods"][method][
        "series"]
    for j, metrics in enumerate(steps):
        assert metrics["sampler/effective_rollouts"] == pytest.approx(series["effective_rollouts"][j]), j
        assert (metrics["ledger/selected"], metrics["ledger/invalid"], metrics["ledger/expired"]) == (
            series["selected"][j], series["invalid"][j], series["expired"][j]), j
