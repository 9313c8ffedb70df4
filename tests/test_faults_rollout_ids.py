"""Rollout ids never repeat and a restarted explorer draws a seed stream of its own, while an
explorer that is never restarted keeps the ids and seed it always had (lockstep runs are compared for determinism)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from divopd.train.runtime.common import explorer_seed, fresh_session, rollout_id_prefix
from test_faults_resume import without_runtime_state
from test_train import tiny_config, tiny_models  # noqa: F401


def test_unrestarted_explorer_keeps_its_ids_and_seed(tmp_path: Path) -> None:
    cfg = tiny_config({"student": "s", "teacher": "t"}, tmp_path, "divopd")
    assert rollout_id_prefix(2) == rollout_id_prefix(2, 0) == "s2x"
    assert explorer_seed(cfg, 1, 2) == explorer_seed(cfg, 1, 2, 0) == cfg.seed * 100_003 + 2 * 1_009 + 1


def test_each_incarnation_has_its_own_ids_and_seed(tmp_path: Path) -> None:
    cfg = tiny_config({"student": "s", "teacher": "t"}, tmp_path, "divopd")
    keys = [(s, x, k) for s in range(1, 4) for x in range(3) for k in range(4)]
    prefixes = {rollout_id_prefix(s, k) + f"{x}-" for s, x, k in keys}
    assert len(prefixes) == len(keys)
    # no id of one (session, incarnation, explorer) starts another's: "s1x1-" vs "s1r1x1-" vs "s11x1-"
    assert not any(a != b and b.startswith(a) for a in prefixes for b in prefixes)
    seeds = {explorer_seed(cfg, x, s, k) for s, x, k in keys}
    assert len(seeds) == len(keys)
    assert all(0 <= seed < 2**32 for seed in seeds)


def test_a_resumed_session_moves_past_every_session_whose_ids_are_logged() -> None:
    assert fresh_session(1, []) == 1
    assert fresh_session(2, ["s1x0-0", "s1x1-4"]) == 2  # the usual resume keeps its number (ids and seeds)
    assert fresh_session(2, ["s1x0-0", "s2x0-0", "s2r1x1-3"]) == 3  # a second resume from the same checkpoint
    assert fresh_session(2, ["s1x0-0", "s2x0-0", "s3x0-1"]) == 4
    assert fresh_session(2, ["s100x0-0", "s101x0-2"]) == 2  # threads session 1 (and its restart)
    assert fresh_session(2, ["s100x0-0", "s200x0-0"]) == 3


def test_ids_after_a_second_resume_from_one_checkpoint_never_repeat_logged_ones(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Lockstep, killed twice past the same checkpoint (its newer checkpoints lost): the session that resumes second
    must not make the ids the first resume logged (both restore the checkpoint's session count). The checkpoint has
    no lockstep runtime state (as an older divopd's): a resume from one with it makes the ids again, exactly as the
    lost session did, and they are cut from the log first (tests/test_faults_resume.py)."""
    import shutil

    from divopd.experience.log import read_log
    from divopd.train import train

    run = tmp_path / "run"
    cfg = tiny_config(tiny_models, run, "divopd", updates=6,
                      **{"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6,
                         "checkpoint.every": 3, "checkpoint.keep": 2})
    train(cfg)
    sessions: list[set[str]] = []
    for _ in range(2):  # the newest checkpoint and the summary lost, as after a kill -9 past update 3
        shutil.rmtree(run / "checkpoints" / "update-000006")
        (run / "summary.json").unlink()
        without_runtime_state(run / "checkpoints" / "update-000003")
        before = {t.turn.rollout_id for t in read_log(run / "experience")}
        train(resume=run)
        sessions.append({t.turn.rollout_id for t in read_log(run / "experience")} - before)
    keys = [(t.turn.rollout_id, t.turn.turn_index) for t in read_log(run / "experience")]
    assert len(keys) == len(set(keys))  # every logged turn has a key of its own
    assert all(sessions) and {r.split("x")[0] for r in sessions[0]} == {"s2"}
    assert {r.split("x")[0] for r in sessions[1]} == {"s3"}


def _wait_restarted(ray: Any, actor: Any, old_pid: int, deadline_s: float = 120.0) -> None:
    """Return once the killed ``actor`` answers from a new process (calls that reach it while it dies or restarts
    fail: they are tried again until the deadline)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if ray.get(actor.pid.remote(), timeout=max(1.0, end - time.monotonic())) != old_pid:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the explorer actor was not restarted within {deadline_s:.0f} s")


# Slow: a Ray session; by default: test_ids_after_a_second_resume_from_one_checkpoint_never_repeat_logged_ones
@pytest.mark.slow
def test_a_restarted_ray_explorer_actor_takes_new_ids_and_seed(tiny_models: dict[str, str],  # noqa: F811
                                                               tmp_path: Path) -> None:
    """A real restart: ``ray.kill(actor, no_restart=False)`` and Ray's ``max_restarts`` bring the actor back; the
    rollouts it collects then have ids disjoint from before, under a new seed."""
    ray = pytest.importorskip("ray")
    from divopd.learn.checkpoint import WeightHandle
    from divopd.models import load_model
    from divopd.train.runtime.ray import ExplorerActor
    from tiny_models import copy_state_dict

    os.environ["RAY_AUTH_MODE"] = "disabled"
    cfg = tiny_config(tiny_models, tmp_path / "restart", "divopd", **{"runtime.kind": "ray"})
    data = cfg.model_dump(mode="json")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        handle = ray.put(WeightHandle(0, state_dict=copy_state_dict(load_model(cfg.student.path)[0])))
        actor = ray.remote(ExplorerActor).options(num_cpus=0, max_restarts=2, max_task_retries=0).remote(
            data, 0, 1, False)
        before = ray.get(actor.identity.remote(), timeout=120)
        ids_before = {r.info.rollout_id for r in ray.get(actor.collect.remote(3, handle), timeout=300)}
        pid = ray.get(actor.pid.remote(), timeout=60)
        ray.kill(actor, no_restart=False)
        _wait_restarted(ray, actor, pid)
        after = ray.get(actor.identity.remote(), timeout=60)
        ids_after = {r.info.rollout_id for r in ray.get(actor.collect.remote(3, handle), timeout=300)}
        assert before == {"incarnation": 0, "seed": explorer_seed(cfg, 0, 1), "id_prefix": "s1x"}
        assert after == {"incarnation": 1, "seed": explorer_seed(cfg, 0, 1, 1), "id_prefix": "s1r1x"}
        assert after["seed"] != before["seed"]
        assert len(ids_before) == 3 and len(ids_after) == 3 and not ids_before & ids_after
        ray.kill(actor, no_restart=True)
    finally:
        ray.shutdown()
