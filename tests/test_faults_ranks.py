"""The learner-rank rows of the fault table (docs/concepts/faults.md): a spawned gloo rank that stops answering
(SIGSTOP) fails the other ranks' collective at ``runtime.collective_timeout_s``, a call no rank answers ends at
``runtime.rank_call_timeout_s``, a call one rank does not answer ends ``runtime.collective_timeout_s`` after the first
answer; each time the driver ends every rank, never a run that waits forever. Real spawned ranks throughout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from divopd.learn.sharded import LearnerRankError
from divopd.train import train
from divopd.train.assemble import open_run, run_trainer
from test_faults_stall import _ckpts, _ended_within, _Hook, _resume, _stop
from test_train import assert_ledger_identity, tiny_config, tiny_models  # noqa: F401

pytestmark = pytest.mark.timeout(900)


def test_a_stopped_rank_fails_the_others_collective_at_the_collective_deadline(
        tiny_models: dict[str, str]) -> None:  # noqa: F811
    """SIGSTOP of rank 1, then a call with a collective (the full state dict's all-gather that every publish makes):
    rank 0's collective fails at ``runtime.collective_timeout_s`` (gloo, 5 s here), the driver raises
    LearnerRankError and ends both ranks. (The same inside a run, with its checkpoint and ``--resume``: the slow
    test below.)"""
    from divopd.learn.settings import LearnerConfig
    from divopd.learn.sharded import ShardedLearner, process_ranks

    learner = ShardedLearner(tiny_models["student"], LearnerConfig(world_size=2), ranks=process_ranks(5))
    pids = learner.ranks.pids
    t0 = time.monotonic()
    try:
        _stop(pids[1])
        with pytest.raises(LearnerRankError, match=r"learner rank \d of 2 .*'full_state_dict'"):
            learner.publish()
        assert time.monotonic() - t0 < 240  # a hang would run into the test's timeout instead
        assert _ended_within(pids)  # both ranks ended, the stopped one included
    finally:
        _resume(pids[1])
        learner.close()


@pytest.mark.slow
def test_a_stopped_learner_rank_fails_the_update_within_the_collective_deadline(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """SIGSTOP of rank 1 after update 3: rank 0's next collective fails at ``runtime.collective_timeout_s`` (gloo),
    the driver ends both ranks, the run fails with the newest good checkpoint (update 2) in place; ``--resume``
    finishes the run from it with a sane ledger."""
    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=5, **{
        "runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 100,
        "checkpoint.every": 2, "learner.world_size": 2, "runtime.collective_timeout_s": 5})
    trainer, _ = open_run(cfg)
    stopped: list[int] = []

    def stop_rank(trainer: Any) -> None:
        stopped.append(trainer.learner.ranks.pids[1])
        _stop(stopped[0])

    t0 = time.monotonic()
    try:
        with pytest.raises(LearnerRankError, match=r"learner rank \d of 2"):
            run_trainer(trainer, _Hook(3, stop_rank))
        assert time.monotonic() - t0 < 240  # a hang would run into the test's timeout instead
        assert _ended_within(stopped)  # the stopped rank was ended, not left behind
    finally:
        for pid in stopped:
            _resume(pid)
    assert _ckpts(tmp_path / "run")[-1] == "update-000002"
    assert not (tmp_path / "run" / "summary.json").exists()
    summary = train(cfg, resume=tmp_path / "run")
    assert summary["resumed"] and summary["updates"] == 5
    assert_ledger_identity(summary["ledger"])


def test_the_reply_deadline_is_the_call_deadline_until_a_rank_answers_then_the_collective_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's wait for the ranks' answers (ReplyDeadline, spawned and Ray ranks): before any answer it is
    ``runtime.rank_call_timeout_s`` from the call; after the first, ``runtime.collective_timeout_s`` + the slack from
    that answer. (With real ranks: every rank stopped, the slow test below; one rank stopped, the test above.)"""
    from divopd.learn import ranks as ranks_module

    now = [100.0]
    monkeypatch.setattr(ranks_module.time, "monotonic", lambda: now[0])
    deadline = ranks_module.ReplyDeadline(call_timeout_s=2.0, collective_timeout_s=5.0)
    now[0] += 1.5
    assert deadline.wait_s() == pytest.approx(0.5)
    now[0] += 1.0
    assert deadline.wait_s() == 0.0  # no rank answered within the call deadline: the driver ends them all
    deadline.answered()  # a late first answer starts the collective deadline
    assert deadline.wait_s() == pytest.approx(5.0 + ranks_module.REPLY_SLACK_S)
    now[0] += 4.0
    deadline.answered()  # later answers do not move it
    assert deadline.wait_s() == pytest.approx(1.0 + ranks_module.REPLY_SLACK_S)
    assert ranks_module.ReplyDeadline(None, None).wait_s() is None


@pytest.mark.slow
def test_ranks_that_all_stop_end_at_the_call_deadline(tiny_models: dict[str, str]) -> None:  # noqa: F811
    """Every rank SIGSTOPped: no rank answers at all, so no collective fails; the driver's wait for the first answer
    has its own deadline (``runtime.rank_call_timeout_s``; 2 s here, set after the ranks' setup) and ends them all."""
    from divopd.learn.settings import LearnerConfig
    from divopd.learn.sharded import ShardedLearner, process_ranks

    learner = ShardedLearner(tiny_models["student"], LearnerConfig(world_size=2), ranks=process_ranks(30, 600))
    learner.ranks._call_timeout_s = 2.0
    pids = learner.ranks.pids
    try:
        for pid in pids:
            _stop(pid)
        with pytest.raises(LearnerRankError, match=r"gave no answer to 'set_state' within runtime.rank_call_timeout_s"):
            learner.ranks.call("set_state", [(1,), (1,)])
        assert _ended_within(pids)
    finally:
        for pid in pids:
            _resume(pid)
        learner.close()


# Slow: by default the reply deadline:
# test_the_reply_deadline_is_the_call_deadline_until_a_rank_answers_then_the_collective_one
@pytest.mark.slow
def test_a_rank_stopped_outside_a_collective_ends_the_ranks_at_the_reply_deadline(
        tiny_models: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A call without a collective (``set_state``): rank 0 answers, the SIGSTOPped rank 1 cannot; the driver waits
    ``runtime.collective_timeout_s`` (+ the slack, 0 here) after rank 0's answer, then ends both ranks instead of
    waiting forever."""
    from divopd.learn import ranks as ranks_module
    from divopd.learn.settings import LearnerConfig
    from divopd.learn.sharded import ShardedLearner, process_ranks

    monkeypatch.setattr(ranks_module, "REPLY_SLACK_S", 0.0)
    learner = ShardedLearner(tiny_models["student"], LearnerConfig(world_size=2), ranks=process_ranks(3))
    pid = learner.ranks.pids[1]
    try:
        _stop(pid)
        with pytest.raises(LearnerRankError, match=r"gave no answer to 'set_state' within runtime.collective"):
            learner.ranks.call("set_state", [(1,), (1,)])
        assert _ended_within([pid])  # the stopped rank was ended, not left behind
    finally:
        _resume(pid)
        learner.close()
