"""kill -9 and the experience log: a directory log is written in whole parts (temporary name,
fsync, rename), so a kill at any moment leaves every logged turn readable, and ``--resume`` queues again every turn
logged after the checkpoint it restores: none is set aside as unreadable, the ledger identity holds and ``received``
equals the turns in the log.

The writer tests are fast; the kill test is a real short lockstep run (tiny environment, random-init tiny models) in
a child process, killed with SIGKILL once turns past its newest checkpoint are on disk, then resumed."""

from __future__ import annotations

import json
import logging
import re
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from divopd import Turn
from divopd.experience.log import PART_PATTERN, ExperienceLogWriter, read_log
from divopd.learn.checkpoint import latest_checkpoint
from test_train import _train_in_a_subprocess, assert_ledger_identity, tiny_config, tiny_models  # noqa: F401


def _turn(rollout: str, t: int = 0) -> Turn:
    n = 3
    return Turn(rollout_id=rollout, turn_index=t, policy_version=0, prompt_ids=np.arange(4, dtype=np.int32),
                response_ids=np.arange(n, dtype=np.int32), action_mask=np.ones(n, dtype=bool),
                student_logprobs=np.zeros(n, dtype=np.float32), teacher_logprobs=np.zeros(n, dtype=np.float32),
                teacher_valid_mask=np.ones(n, dtype=bool), info={"env": "tiny"})


def test_each_extend_is_on_disk_in_whole_parts_while_the_writer_is_open(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    w = ExperienceLogWriter(d, rows_per_file=2, write_ids=True)  # never closed: as a killed run leaves it
    w.extend([_turn("a", 0), _turn("a", 1), _turn("a", 2)], arrival_update=0)
    w.extend([_turn("b", 0)], arrival_update=1)
    back = list(read_log(d, require_ids=True))
    assert [(b.turn.rollout_id, b.arrival, b.arrival_update) for b in back] == [
        ("a", 0, 0), ("a", 1, 0), ("a", 2, 0), ("b", 3, 1)]
    parts = sorted(p.name for p in d.iterdir())
    assert parts == [f"part-00000{i}.parquet" for i in range(3)]  # 3 rows, at most 2 a part; then 1 row
    assert [pq.read_metadata(d / p).num_rows for p in parts] == [2, 1, 1]


def test_a_part_interrupted_before_its_rename_is_not_in_the_log_and_is_removed(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    w = ExperienceLogWriter(d, write_ids=True)
    w.extend([_turn("a")], arrival_update=0)
    (d / "part-000001.parquet.tmp").write_bytes(b"PAR1 killed mid-write")  # what a kill during write_part leaves
    (d / "notes.tmp").write_text("not the log's")
    assert [b.arrival for b in read_log(d)] == [0]  # readers never see it
    w2 = ExperienceLogWriter(d, write_ids=True)  # the resumed run's writer removes it and continues
    assert not (d / "part-000001.parquet.tmp").exists() and (d / "notes.tmp").exists()
    w2.extend([_turn("b")], arrival_update=0)
    assert [b.arrival for b in read_log(d)] == [0, 1]


def _next_arrival(ckpt: Path) -> int:
    return int(json.loads((ckpt / "state.json").read_text())["extra_state"]["sampler"]["next_arrival"])


def _logged_past_newest_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """(newest checkpoint, turns on disk with an arrival at or past its next arrival), or ``None`` if none yet."""
    try:
        ckpt = latest_checkpoint(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else None
        if ckpt is None:
            return None
        start = _next_arrival(ckpt)
        parts = sorted(p for p in (run_dir / "experience").iterdir() if PART_PATTERN.match(p.name))
        arrivals = [pq.read_table(p, columns=["arrival"]).column("arrival").to_numpy() for p in parts]
    except (OSError, ValueError, KeyError):  # a checkpoint pruned while read: look again
        return None
    return ckpt, int(sum((a >= start).sum() for a in arrivals))


# Slow: by default a kill -9 and resume:
# test_faults_resume.py::test_sigkill_at_each_phase_then_resume_equals_the_uninterrupted_run
@pytest.mark.slow
def test_kill_9_then_resume_queues_again_every_turn_logged_after_the_checkpoint(
        tiny_models: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    run_dir = tmp_path / "killed"
    cfg = tiny_config(tiny_models, run_dir, "divopd", updates=10, **{"checkpoint.every": 2, "eval.every": 100})
    proc = _train_in_a_subprocess(cfg, tmp_path)
    try:
        # Kill while turns are being logged past the newest checkpoint: seen twice, more the second time, under the
        # same checkpoint (not only in the moment between a checkpoint's log flush and its write).
        deadline, before = time.monotonic() + 600, None  # generous: the verdict must not depend on machine load
        while time.monotonic() < deadline:
            seen = _logged_past_newest_checkpoint(run_dir)
            if seen is not None and before is not None and seen[0] == before[0] and seen[1] > before[1] > 0:
                break
            before = seen
            if proc.poll() is not None:
                pytest.fail(f"the run ended (exit {proc.returncode}) before a turn past its newest checkpoint was "
                            "on disk: logged turns wait in memory until a checkpoint")
            time.sleep(0.05)
        else:
            pytest.fail("no turn logged past a checkpoint within 600 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    seen = _logged_past_newest_checkpoint(run_dir)
    assert seen is not None
    ckpt, past = seen
    assert past > 0, f"no turn past {ckpt.name} was on disk when the run was killed"

    from divopd.train import train

    with caplog.at_level(logging.INFO):
        summary = train(resume=run_dir)
    experience = run_dir / "experience"
    assert not [p.name for p in experience.iterdir() if not PART_PATTERN.match(p.name)], "only whole parts remain"
    assert "set aside" not in caplog.text
    requeued = [int(m) for m in re.findall(r"resume: (\d+) logged turns past the checkpoint queued again",
                                           caplog.text)]
    assert requeued == [past], f"every turn logged after {ckpt.name} is queued again"
    assert summary["resumed"] and summary["updates"] == 10
    assert_ledger_identity(summary["ledger"])
    arrivals = [t.arrival for t in read_log(experience)]
    assert arrivals == list(range(summary["ledger"]["received"])), "received equals the turns in the log"


# ---------------------------------------------------------------------------------------------------- stop paths
def test_a_threads_stop_hands_over_the_rollouts_in_hand(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Stop requested while both explorer threads are in a rollout and the queue is full: the rollouts they finish
    after the stop come back from ``shutdown`` instead of being dropped."""
    from divopd.learn.checkpoint import WeightHandle
    from divopd.train.runtime.threads import ThreadsRuntime

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", **{
        "runtime.kind": "threads", "runtime.num_explorers": 2, "runtime.queue_rollouts": 1})
    runtime = ThreadsRuntime(cfg, WeightHandle(version=0, path=tiny_models["student"]), session=1)
    polled = []
    try:
        deadline = time.monotonic() + 300
        while len(polled) < 2 or not runtime._rollouts.full():  # some taken, then the queue full again
            assert time.monotonic() < deadline, "the explorers produced nothing within 300 s"
            if len(polled) < 2:
                polled += runtime.poll(timeout=1.0)
            else:
                time.sleep(0.01)
        leftover = runtime.shutdown(interrupted=True)
    finally:
        runtime.close(interrupted=True)
    received = sum(len(r.turns) for r in polled + leftover)
    assert len(leftover) >= 2, "the queued rollout and at least one finished after the stop come back"
    assert received == runtime.produced_turns


def test_ctrl_c_on_a_threads_run_receives_every_turn_the_explorers_produced(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    import threading

    from divopd.train.assemble import open_run, run_trainer
    from divopd.train.interrupt import StopRequest

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=50, **{
        "runtime.kind": "threads", "runtime.num_explorers": 2, "runtime.queue_rollouts": 1, "eval.every": 100})
    trainer, _ = open_run(cfg)
    stop = StopRequest()
    done = threading.Event()

    def request_stop() -> None:  # Ctrl-C after the first update, while the explorers are mid-rollout
        deadline = time.monotonic() + 300
        while trainer.version < 1 and time.monotonic() < deadline and not done.is_set():
            time.sleep(0.01)
        stop.set(signal.SIGINT)

    watcher = threading.Thread(target=request_stop, daemon=True)
    watcher.start()
    try:
        summary = run_trainer(trainer, stop=stop)
    finally:
        done.set()
        watcher.join(timeout=10)
    assert summary["interrupted"] and summary["updates"] < 50
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == summary["produced_turns"]
    arrivals = [t.arrival for t in read_log(tmp_path / "run" / "experience")]
    assert arrivals == list(range(summary["ledger"]["received"]))


@pytest.mark.slow
def test_a_ray_stop_receives_the_collect_results_not_yet_polled(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Collect calls that finished but were never polled come back from ``shutdown`` instead of dying with the
    killed actors."""
    pytest.importorskip("ray")
    import ray

    from divopd.learn.checkpoint import WeightHandle
    from divopd.train.runtime.ray import RayRuntime

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", **{
        "runtime.kind": "ray", "runtime.ray_num_cpus": 2, "runtime.num_explorers": 2})
    runtime = RayRuntime(cfg, WeightHandle(version=0, path=tiny_models["student"]), 1, [])
    try:
        ready, _ = ray.wait(list(runtime._inflight), num_returns=1, timeout=300)  # finished, not polled
        assert ready, "no explorer actor finished a rollout within 300 s"
        finished = runtime.shutdown(interrupted=True)
    finally:
        runtime.close(interrupted=True)
    assert len(finished) >= 1 and all(r.turns for r in finished)
