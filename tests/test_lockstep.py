"""runtime.kind: lockstep — one process, no threads: same config and seed ⇒ the same run, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from divopd.experience.log import log_files
from divopd.train import train
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401


def _timed(key: str) -> bool:
    """Keys that measure wall time, not the computation."""
    return "time" in key or key.endswith(("_s", "_s_total", "seconds"))


def _lockstep(models: dict[str, str], run_dir: Path, seed: int = 0, **over: object) -> dict:
    cfg = tiny_config(models, run_dir, "divopd", updates=6, seed=seed,
                      **{"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 3,
                         **over})
    return train(cfg)


def _series(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not _timed(k)}
            for r in read_metrics(run_dir)]


def _log_table(run_dir: Path) -> list[dict]:
    rows = []
    for f in log_files(run_dir / "experience"):
        rows += pq.read_table(f).to_pylist()
    return rows


def test_same_seed_same_run_bit_for_bit(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    a = _lockstep(tiny_models, tmp_path / "a")
    b = _lockstep(tiny_models, tmp_path / "b")
    assert a["updates"] == b["updates"] == 6
    assert_ledger_identity(a["ledger"])
    assert a["ledger"] == b["ledger"] and a["env_steps"] == b["env_steps"]
    sa, sb = _series(tmp_path / "a"), _series(tmp_path / "b")
    assert [r["learner/loss"] for r in sa if r["kind"] == "update"] == \
        [r["learner/loss"] for r in sb if r["kind"] == "update"]
    assert sa == sb  # every learner, sampler, ledger and eval value
    assert _log_table(tmp_path / "a") == _log_table(tmp_path / "b")


# Slow: by default determinism: test_same_seed_same_run_bit_for_bit
@pytest.mark.slow
def test_another_seed_is_another_run(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    _lockstep(tiny_models, tmp_path / "a", seed=0)
    _lockstep(tiny_models, tmp_path / "b", seed=1)
    assert _log_table(tmp_path / "a") != _log_table(tmp_path / "b")


@pytest.mark.parametrize("steps", [pytest.param(3, marks=pytest.mark.slow), 12])
def test_env_steps_per_update_sets_the_producer_load(tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
                                                      steps: int) -> None:
    summary = _lockstep(tiny_models, tmp_path / "run", **{"runtime.lockstep.env_steps_per_update": steps})
    # every update is preceded by at least `steps` env steps; more only while the sampler waits for turns
    assert summary["env_steps"] >= steps * summary["updates"]
    assert_ledger_identity(summary["ledger"])
    rows = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "update"]
    assert [r["update"] for r in rows] == list(range(1, 7))
    # producer load (Table 2): turns received per poll (one learner step of production) ÷ B; arrival/drain divides by
    # the updates taken, so it cannot fall below 1 where the learner had to wait
    polls, received = summary["producer_intervals"], summary["ledger"]["received"]
    assert summary["producer_load"] == pytest.approx(received / (polls * 6))
    assert rows[-1]["queue/producer_load"] == pytest.approx(summary["producer_load"])
    assert summary["arrival_drain_ratio"] >= 1
    if steps == 3:  # 3 turns per poll at most, B = 6: the learner waits
        assert summary["producer_load"] <= 0.5 and polls > summary["updates"]
    else:
        assert summary["producer_load"] > 1


def test_turn_enqueue_queues_every_student_step_at_once_and_stays_deterministic(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    over = {"explorer.enqueue": "turn"}
    a = _lockstep(tiny_models, tmp_path / "a", **over)
    b = _lockstep(tiny_models, tmp_path / "b", **over)
    assert_ledger_identity(a["ledger"])
    # no +R: every env step is a student turn, and each enters the queue in the round it is taken
    assert a["ledger"]["received"] == a["env_steps"]
    assert a["ledger"] == b["ledger"] and _series(tmp_path / "a") == _series(tmp_path / "b")
    rows = _log_table(tmp_path / "a")
    assert rows == _log_table(tmp_path / "b")
    # only a rollout's last turn knows the outcome; a rollout is counted once, when that turn arrives
    ended = {r["rollout_id"] for r in rows if r["success"] is not None}
    running = {r["rollout_id"] for r in rows} - ended
    assert ended and running
    last = [r for r in read_metrics(tmp_path / "a") if r["kind"] == "update"][-1]
    assert last["explorer/rollouts"] == len(ended)


def test_a_resume_from_an_earlier_checkpoint_redoes_the_later_turns_as_they_were(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """As after kill -9 past update 3: the newest checkpoint and the summary are gone, --resume redoes updates 4–6.
    The checkpoint holds the lockstep runtime's state, so the turns logged after it are cut from the log
    and produced again, as they were: the resumed run's log and metrics equal the finished run's, every received
    turn logged once (the SIGKILL cases: tests/test_faults_resume.py)."""
    import shutil

    from divopd.experience.log import read_log

    run = tmp_path / "run"
    _lockstep(tiny_models, run, **{"checkpoint.every": 3, "checkpoint.keep": 2})
    logged, series, table = list(read_log(run / "experience")), _series(run), _log_table(run)
    shutil.rmtree(run / "checkpoints" / "update-000006")
    (run / "summary.json").unlink()
    shutil.copytree(run, tmp_path / "copy")
    assert max(x.arrival_update for x in logged) > 3  # turns arrived after the checkpoint in the lost session
    summary = train(resume=run)
    assert summary["resumed"] and summary["updates"] == 6
    assert_ledger_identity(summary["ledger"])
    assert [r["update"] for r in read_metrics(run) if r["kind"] == "update"] == list(range(1, 7))
    after = list(read_log(run / "experience"))  # read_log checks arrival order and non-decreasing arrival_update
    assert [x.arrival for x in after] == list(range(summary["ledger"]["received"]))
    assert _series(run) == series and _log_table(run) == table
    assert summary["producer_intervals"] >= 6  # at least one poll per update, over both sessions
    last = [r for r in read_metrics(run) if r["kind"] == "update"][-1]
    assert last["queue/producer_load"] == pytest.approx(summary["producer_load"])
    # a lockstep resume is itself deterministic: the same directory resumed twice gives the same run
    train(resume=tmp_path / "copy")
    assert _series(run) == _series(tmp_path / "copy") and _log_table(run) == _log_table(tmp_path / "copy")
