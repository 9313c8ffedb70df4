"""Faults around checkpoints (a failed update, atomic writes): an update that fails never
replaces the newest good checkpoint nor waits for a final evaluation; the leftovers of an interrupted checkpoint write
are cleaned at the next start; ``summary.json`` and ``config.yaml`` are written atomically.

Real short lockstep runs on the tiny environment with random-init tiny models; the fault is an exception raised from
the learner's optimizer step at one update."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from divopd.learn import checkpoint as ckpt_mod
from divopd.learn.checkpoint import atomic_write_text, latest_checkpoint, remove_interrupted_writes
from divopd.learn.learner import Learner
from divopd.train import loop, train
from divopd.train import rundir as rundir_mod
from divopd.train import trainer as trainer_mod
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

UPDATES, FAIL_AT, B = 6, 5, 6  # checkpoints every 2 updates: the last good one before the failure is update 4


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def _fail_update_at(monkeypatch: pytest.MonkeyPatch, run_dir: Path, exc: BaseException) -> dict[str, dict]:
    """Make the learner's ``FAIL_AT``-th optimizer step raise ``exc`` (after snapshotting the newest checkpoint)."""
    real_step, seen = Learner.step, {"calls": 0, "before": {}}

    def step(self: Learner, batch: object) -> dict[str, float]:
        seen["calls"] += 1
        if seen["calls"] == FAIL_AT:
            newest = latest_checkpoint(run_dir / "checkpoints")
            assert newest is not None and newest.name == f"update-{FAIL_AT - 1:06d}"
            seen["before"] = {newest.name: _snapshot(newest)}
            raise exc
        return real_step(self, batch)

    def no_final_eval(*args: object, **kwargs: object) -> None:
        raise AssertionError("a failing run must not wait for a final evaluation")

    monkeypatch.setattr(Learner, "step", step)
    monkeypatch.setattr(loop, "_wait_for_evals", no_final_eval)
    return seen


def _config(models: dict[str, str], run_dir: Path) -> object:
    return tiny_config(models, run_dir, "divopd", updates=UPDATES,
                       **{"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 3,
                          "checkpoint.every": 2, "checkpoint.keep": 2, "sampler.batch_size": B})


@pytest.mark.parametrize("exc", [RuntimeError("injected fault in update"), KeyboardInterrupt()],
                         ids=["exception", "second-ctrl-c"])
def test_a_failing_update_keeps_the_last_good_checkpoint_and_resume_retrains_it(
        exc: BaseException, tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    seen = _fail_update_at(monkeypatch, run_dir, exc)
    with pytest.raises(type(exc)):
        train(_config(tiny_models, run_dir))
    assert seen["calls"] == FAIL_AT
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["update-000002", "update-000004"]  # nothing new, no tmp
    (name, before), = seen["before"].items()
    assert _snapshot(ckpts / name) == before  # byte for byte the checkpoint of the last good update
    state = json.loads((ckpts / name / "state.json").read_text())
    counts = state["extra_state"]["sampler"]["counts"]
    assert counts["selected"] == (FAIL_AT - 1) * B  # the batch of the failed update is not counted selected
    assert not (run_dir / "summary.json").exists()  # unfinished: `divopd bench` resumes it

    # resume: a planted leftover of an interrupted checkpoint write is removed, foreign entries stay
    monkeypatch.undo()
    planted = ckpts / ".update-000004.tmp-xyz"
    planted.mkdir()
    (planted / "model.safetensors").write_bytes(b"torn")
    foreign = [ckpts / "notes", ckpts / ".mine.tmp-xyz"]
    for f in foreign:
        f.mkdir()
    written: list[str] = []

    def spy(path: str | os.PathLike, text: str) -> None:
        written.append(Path(path).name)
        atomic_write_text(path, text)

    for module in (rundir_mod, trainer_mod):  # config.yaml, summary.json
        monkeypatch.setattr(module, "atomic_write_text", spy)
    summary = train(resume=run_dir)
    assert summary["updates"] == UPDATES and not summary["interrupted"]
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["selected"] == UPDATES * B
    assert not planted.exists() and all(f.is_dir() for f in foreign)
    assert written == ["config.yaml", "summary.json"]
    losses = [m["update"] for m in read_metrics(run_dir) if m["kind"] == "update" and "learner/loss" in m]
    assert losses == list(range(1, UPDATES + 1))  # the failed update is trained again, every update once


def test_remove_interrupted_writes_restores_a_moved_aside_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "checkpoints"
    (d / ".update-000006.tmp-ab_c1").mkdir(parents=True)  # the new copy, half written
    (d / ".update-000004.old-123").mkdir()  # moved aside, its replacement never renamed in: the last copy
    (d / ".update-000004.old-123" / "state.json").write_text("{}")
    (d / "update-000002").mkdir()
    (d / ".update-000002.old-9").mkdir()  # replaced: the new update-000002 is in place
    (d / ".update-000002.tmp").mkdir()  # not divopd's pattern: kept
    done = remove_interrupted_writes(d)
    assert len(done) == 3
    assert sorted(p.name for p in d.iterdir()) == [".update-000002.tmp", "update-000002", "update-000004"]
    assert (d / "update-000004" / "state.json").read_text() == "{}"


def test_atomic_write_text_leaves_the_old_file_when_the_write_fails(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.json"
    target.write_text('{"updates": 3}')

    def torn(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.os, "fsync", torn)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, '{"updates": 6, "ledger": ')
    assert target.read_text() == '{"updates": 3}'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left
    monkeypatch.undo()
    atomic_write_text(target, '{"updates": 6}')
    assert target.read_text() == '{"updates": 6}'


def test_explorers_dying_at_a_stage_boundary_checkpoint_that_state_without_a_final_evaluation(
        tiny_models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from divopd.train.assemble import open_run
    from test_loop import MemoryRuntime

    class Dying(MemoryRuntime):
        """Produces for 8 polls, then nothing, and then no explorer is left."""

        def poll(self, timeout: float) -> list:
            return super().poll(timeout) if self.polls < 8 else []

        def check_alive(self) -> None:
            if self.polls >= 8:
                raise RuntimeError("no explorer left")

    def no_final_eval(*args: object, **kwargs: object) -> None:
        raise AssertionError("a failing run must not wait for a final evaluation")

    monkeypatch.setattr(loop, "_wait_for_evals", no_final_eval)
    run_dir = tmp_path / "run"
    trainer, _ = open_run(tiny_config(tiny_models, run_dir, "divopd", updates=50, **{"checkpoint.every": 100}))
    runtime = Dying(trainer.learner.model.get_input_embeddings().num_embeddings)
    with pytest.raises(RuntimeError, match="no explorer left"):
        loop.run_loop(trainer, runtime)
    version = trainer.version
    assert 0 < version < 50 and runtime.calls[-2:] == ["shutdown:True", "close:True"]
    newest = latest_checkpoint(run_dir / "checkpoints")
    assert newest is not None and newest.name == f"update-{version:06d}"  # the boundary state, trained batches only
    sampler = json.loads((newest / "state.json").read_text())["extra_state"]["sampler"]
    assert sampler["counts"]["selected"] == version * B and not (run_dir / "summary.json").exists()
