"""SIGKILL of a lockstep run at each phase, then ``--resume``: the resumed run equals the uninterrupted one.

Under ``runtime.kind: lockstep`` a checkpoint holds the runtime's state (the round-robin position, the step budget, each
explorer's running episodes, seeds, task stream and counters; :meth:`Explorer.state_dict`), so a run killed
at any moment and resumed from its newest checkpoint produces the same ``learner/loss`` series, the same values of every
other untimed learner / sampler / ledger key, the same evaluations and the same experience log, turn for turn, as the
same-seed run that was never interrupted.

Each case is a real ``divopd train`` child process that kills itself with SIGKILL at a known visit of one phase
(``DIVOPD_SIGKILL_AT``, :func:`divopd.train.interrupt.fault_point`), chosen from the reference run's own visits: the
first one after update 2's checkpoint (for ``checkpoint`` and ``eval``: the ones of update 4, before that checkpoint
is written and before that evaluation is recorded). The resume runs in this process. Tiny random-init models on the
tiny environment; one uninterrupted reference run per module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from divopd.experience.log import PART_PATTERN, log_files, read_log
from divopd.learn.checkpoint import latest_checkpoint
from divopd.train import interrupt
from divopd.train.rundir import EXPLORER_WEIGHTS, runtime_weight_files
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

#: (phase, the learner version from which its kill visit is chosen): every kill falls after the checkpoint of update 2
#: and before the one of update 4, so the resume starts from update 2 and redoes what the killed run did after it
KILLS = {"poll": 3, "log": 3, "compose": 3, "update": 3, "publish": 3, "eval": 4, "checkpoint": 4}
UPDATES = 6


def _config(models: dict[str, str], run_dir: Path, updates: int = UPDATES, method: str = "divopd",
            **over: object) -> Any:
    return tiny_config(models, run_dir, method, updates=updates, **{
        "runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 5, "eval.every": 2,
        "checkpoint.every": 2, "checkpoint.keep": 2, "explorer.num_envs": 3, **over})


def _timed(key: str) -> bool:
    return "time" in key or key.endswith(("_s", "_s_total", "seconds"))


def _series(run_dir: Path) -> list[dict]:
    """Every metrics record (updates and evaluations) without its wall-time keys."""
    return [{k: v for k, v in r.items() if not _timed(k)} for r in read_metrics(run_dir)]


def _log_table(run_dir: Path) -> list[dict]:
    rows = []
    for f in log_files(run_dir / "experience"):
        rows += pq.read_table(f).to_pylist()
    return rows


def _reference(models: dict[str, str], run_dir: Path, updates: int = UPDATES, method: str = "divopd",
               **over: object) -> tuple[dict, list[tuple[str, int]]]:
    """The uninterrupted run, and each fault-point visit with the learner version it was reached at."""
    from divopd.train import loop, trainer
    from divopd.train import train as train_run
    from divopd.train.runtime import lockstep

    visits: list[tuple[str, int]] = []
    version = {"v": 0}
    real = interrupt.fault_point

    def spy(phase: str) -> None:
        if phase == "publish":  # reached after the optimizer step: the learner is at the next version
            version["v"] += 1
        visits.append((phase, version["v"]))
        real(phase)

    with pytest.MonkeyPatch.context() as mp:
        for module in (loop, trainer, lockstep):
            mp.setattr(module, "fault_point", spy)
        summary = train_run(_config(models, run_dir, updates, method, **over))
    return summary, visits


def _kill_spec(visits: list[tuple[str, int]], phase: str, at_version: int) -> str:
    """``phase:n``: the first visit of ``phase`` at learner version ``at_version`` or later."""
    seen = 0
    for name, version in visits:
        if name == phase:
            seen += 1
            if version >= at_version:
                return f"{phase}:{seen}"
    raise AssertionError(f"the reference run never reached {phase} at version {at_version}")


def _killed_run(cfg: Any, tmp_path: Path, spec: str, signal: str = "SIGKILL") -> int:
    """``divopd train`` in a child process that sends itself ``signal`` at ``spec``; its exit status."""
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if k not in ("DIVOPD_SIGINT_AT", "DIVOPD_SIGKILL_AT")}
    env.update({"HF_HUB_OFFLINE": "1", f"DIVOPD_{signal}_AT": spec})
    return subprocess.run([sys.executable, "-m", "divopd", "train", str(cfg_path), "--no-progress"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=900).returncode


@pytest.fixture(scope="module")
def reference(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    summary, visits = _reference(tiny_models, run_dir)
    return {"summary": summary, "visits": visits, "series": _series(run_dir), "log": _log_table(run_dir)}


def without_runtime_state(ckpt: Path) -> None:
    """Make ``ckpt`` a checkpoint without the lockstep runtime's state, as an older divopd (or a lockstep run whose
    explorers generate with vLLM) writes it: ``--resume`` then queues the turns logged after it again (the threads
    and Ray runtimes' resume) instead of producing them again."""
    path = ckpt / "state.json"
    state = json.loads(path.read_text())
    state["extra_state"].pop("runtime", None)
    path.write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink(missing_ok=True)  # an older divopd's checkpoint has no manifest


def _check_resumed_equals(run_dir: Path, ref: dict) -> dict:
    """Resume ``run_dir`` in this process and compare it with the uninterrupted run."""
    from divopd.train import train

    summary = train(resume=run_dir)
    assert summary["resumed"] and summary["updates"] == ref["summary"]["updates"]
    series = _series(run_dir)
    losses = [r["learner/loss"] for r in series if r["kind"] == "update"]
    assert losses == [r["learner/loss"] for r in ref["series"] if r["kind"] == "update"]
    evals = [r for r in series if r["kind"] == "eval"]
    assert evals and evals == [r for r in ref["series"] if r["kind"] == "eval"], "the same evaluations"
    assert series == ref["series"], "every untimed learner, sampler, ledger and eval value, each update once"
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"] == ref["summary"]["ledger"] and summary["env_steps"] == ref["summary"]["env_steps"]
    assert [t.arrival for t in read_log(run_dir / "experience")] == list(range(summary["ledger"]["received"]))
    assert _log_table(run_dir) == ref["log"], "every turn logged once, as the uninterrupted run logged it"
    return summary


#: The kill point the default suite runs: the explorer's (poll); log, compose, update, publish, eval and
#: checkpoint resume by the same path (the checkpoint of update 2, the log cut after it) and run under
#: -m slow (a kill -9 while the log is written: tests/test_faults_killrec.py; torn checkpoint writes:
#: tests/test_faults_checkpoint.py).
SLOW_KILLS = ("log", "compose", "update", "publish", "eval", "checkpoint")


@pytest.mark.parametrize("phase", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_KILLS else p for p in KILLS])
def test_sigkill_at_each_phase_then_resume_equals_the_uninterrupted_run(
        phase: str, reference: dict, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    run_dir = tmp_path / "run"
    spec = _kill_spec(reference["visits"], phase, KILLS[phase])
    assert _killed_run(_config(tiny_models, run_dir), tmp_path, spec) == -9, f"not killed at {spec}"
    # on disk: the newest good checkpoint (update 2), no summary, only whole log parts
    ckpts = run_dir / "checkpoints"
    assert latest_checkpoint(ckpts) == ckpts / "update-000002"
    assert not (run_dir / "summary.json").exists()
    state = json.loads((ckpts / "update-000002" / "state.json").read_text())["extra_state"]
    assert state["runtime"]["explorers"], "the checkpoint holds the lockstep runtime's state"
    assert all(PART_PATTERN.match(p.name) or p.name.endswith(".tmp") for p in (run_dir / "experience").iterdir())

    _check_resumed_equals(run_dir, reference)
    kept = sorted(p for p in ckpts.iterdir() if p.name.startswith("update-"))
    assert [p.name for p in kept] == ["update-000004", "update-000006"]
    named = set().union(*(runtime_weight_files(json.loads((p / "state.json").read_text())["extra_state"]
                                               .get("runtime")) for p in kept))
    weights = run_dir / EXPLORER_WEIGHTS
    assert {f.name for f in weights.iterdir()} == named if weights.is_dir() else not named


# Slow: by default a terminal Ctrl-C: test_cli_user.py::test_ctrl_c_in_a_terminal_ends_with_the_resume_command, and
# SIGINT in every phase: test_interrupt.py
@pytest.mark.slow
@pytest.mark.parametrize("phase", ["poll", "compose"])
def test_ctrl_c_then_resume_equals_the_uninterrupted_run(
        phase: str, reference: dict, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """A stop request (SIGINT) checkpoints at the next stage boundary, between two updates (after polls whose turns
    wait in the queue): resumed from that checkpoint, the run still equals the uninterrupted one."""
    run_dir = tmp_path / "run"
    spec = _kill_spec(reference["visits"], phase, 3)
    assert _killed_run(_config(tiny_models, run_dir), tmp_path, spec, "SIGINT") == 130
    assert json.loads((run_dir / "summary.json").read_text())["interrupted"]
    _check_resumed_equals(run_dir, reference)


# Slow: three runs; by default a single kill: test_sigkill_at_each_phase_then_resume_equals_the_uninterrupted_run[poll]
@pytest.mark.slow
def test_a_killed_resume_resumes_again_and_still_equals_the_uninterrupted_run(
        reference: dict, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Killed, resumed and killed again (in the resumed session, inside a poll), then resumed once more."""
    run_dir = tmp_path / "run"
    cfg = _config(tiny_models, run_dir)
    assert _killed_run(cfg, tmp_path, _kill_spec(reference["visits"], "update", 3)) == -9
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DIVOPD_SIGKILL_AT": "poll:4"}
    rc = subprocess.run([sys.executable, "-m", "divopd", "train", "--resume", str(run_dir), "--no-progress"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=900).returncode
    assert rc == -9
    _check_resumed_equals(run_dir, reference)


@pytest.mark.slow
@pytest.mark.parametrize("phase", list(KILLS))
def test_sigkill_late_in_a_longer_run_with_two_explorers_and_recovery(
        phase: str, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Longer: 12 updates, two explorers, +R (teacher takeovers), turns queued per round; killed after update 8."""
    over = {"runtime.num_explorers": 2, "explorer.enqueue": "turn"}
    ref_dir = tmp_path / "reference"
    summary, visits = _reference(tiny_models, ref_dir, 12, "divopd-r", **over)
    ref = {"summary": summary, "series": _series(ref_dir), "log": _log_table(ref_dir)}
    run_dir = tmp_path / "run"
    cfg = _config(tiny_models, run_dir, 12, "divopd-r", **over)
    at = KILLS[phase] + 6
    assert _killed_run(cfg, tmp_path, _kill_spec(visits, phase, at)) == -9
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "update-000008"
    _check_resumed_equals(run_dir, ref)


def test_an_episode_state_survives_json_exactly() -> None:
    import numpy as np

    from divopd.explore.episode import Episode, StudentStep, episode_from_state, episode_state

    lp = np.array([-0.1, -2.5e-8, -13.75], dtype=np.float32)
    e = Episode(rollout_id="s1x0-3", task="train:7", first_observation="room 1", valid_actions=["look around"],
                history=[("move east", "room 2")], student_steps=[StudentStep(
                    step=0, prompt_ids=[1, 2, 3], prompt_truncated=False, response_ids=[4, 5, 6], logprobs=lp,
                    policy_version=2, action="move east", reward=0.0, progress=True, score=0.1)], steps=1, queued=1)
    e.recovery.no_progress_streak, e.recovery.last_action, e.recovery.log = 1, "move east", [("student", True)]
    back = episode_from_state(json.loads(json.dumps(episode_state(e))))
    assert back.student_steps[0].logprobs.dtype == np.float32
    assert back.student_steps[0].logprobs.tobytes() == lp.tobytes()
    back.student_steps[0].logprobs = e.student_steps[0].logprobs = None  # arrays compared above
    assert back == e


@pytest.mark.parametrize("how", ["observation", "replayable"])
def test_an_env_that_does_not_replay_resumes_as_threads_with_one_warning(
        how: str, tiny_models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """A lockstep checkpoint whose env cannot replay — a recorded observation the env does not give back (as a
    non-deterministic env would), or an env that says ``replayable = False`` now — is still resumed: one
    warning that the run is no longer exact, the turns logged past the checkpoint queued again (the threads
    runtime's resume), the ledger whole, every received turn logged once, each update recorded once."""
    from divopd.explore.envs import tiny
    from divopd.train import train

    run = tmp_path / "run"
    train(_config(tiny_models, run, updates=4))
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "update-000004")
    state_path = run / "checkpoints" / "update-000002" / "state.json"
    state = json.loads(state_path.read_text())
    past = len(list(read_log(run / "experience"))) - int(state["extra_state"]["sampler"]["next_arrival"])
    assert past > 0, "turns logged past the checkpoint"
    if how == "observation":
        slot = next(s for e in state["extra_state"]["runtime"]["explorers"] for s in e["slots"] if s is not None)
        slot["first_observation"] += " (not what the env says)"
        state_path.write_text(json.dumps(state))
        (state_path.parent / "manifest.json").unlink()  # edited by hand: checked as an older divopd's checkpoint
    else:
        real_init = tiny.TinyEnv.__init__

        def not_replayable(self: object, *args: object, **kwargs: object) -> None:
            real_init(self, *args, **kwargs)  # type: ignore[arg-type]
            self.replayable = False  # type: ignore[attr-defined]

        monkeypatch.setattr(tiny.TinyEnv, "__init__", not_replayable)
    with caplog.at_level("WARNING", logger="divopd.train.resume"):
        summary = train(resume=run)
    lines = [r.getMessage() for r in caplog.records if r.name == "divopd.train.resume"]
    assert len(lines) == 1 and "no longer exact" in lines[0] and "queued again" in lines[0], lines
    assert ("not deterministic under replay" if how == "observation" else "Env.replayable is False") in lines[0]
    assert summary["resumed"] and summary["updates"] == 4
    assert_ledger_identity(summary["ledger"])
    assert [t.arrival for t in read_log(run / "experience")] == list(range(summary["ledger"]["received"]))
    assert [r["update"] for r in read_metrics(run) if r["kind"] == "update"] == [1, 2, 3, 4]


def test_an_env_with_randomness_of_its_own_is_not_resumed_exactly(tiny_models: dict[str, str],  # noqa: F811
                                                                   tmp_path: Path) -> None:
    """The tiny env's ``crash_prob`` draws from an RNG of the instance, which a replay does not restore: its
    checkpoints hold no runtime state, and a resume queues the logged turns again (the threads runtime's resume)."""
    from divopd.train import train

    run = tmp_path / "run"
    train(_config(tiny_models, run, updates=2, **{"explorer.env_kwargs.crash_prob": 0.05}))
    state = json.loads((run / "checkpoints" / "update-000002" / "state.json").read_text())["extra_state"]
    assert "runtime" not in state and state["sampler"]
    plain = tmp_path / "plain"
    train(_config(tiny_models, plain, updates=2))
    assert "runtime" in json.loads((plain / "checkpoints" / "update-000002" / "state.json").read_text())["extra_state"]
