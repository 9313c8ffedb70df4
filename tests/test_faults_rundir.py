"""Run directories: divopd writes, replaces and deletes only inside a directory it made a run (its
``.divopd-run`` marker, or an older run's config.yaml + metrics.jsonl); ``--resume`` never deletes what it cannot
restore; a resumed ``learner.estimator: topk`` run handles the re-queued turns (no teacher top-k in the log)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from divopd.experience.log import read_log
from divopd.train import train
from divopd.train.runlock import LOCK
from test_faults_resume import without_runtime_state
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
MARKER = ".divopd-run"


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _user_folder(folder: Path) -> dict[str, str]:
    """A folder of the user's own: a config.yaml of theirs, a checkpoints/ and experience/ of theirs, notes."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "experience").mkdir()
    (folder / "config.yaml").write_text("my: own config\n")
    (folder / "notes.txt").write_text("mine\n")
    (folder / "checkpoints" / "weights.bin").write_bytes(b"\x00\x01")
    (folder / "experience" / "data.csv").write_text("a,b\n")
    return _tree(folder)


def _cli(capfd: pytest.CaptureFixture[str], *argv: str) -> subprocess.CompletedProcess[str]:
    """``divopd ARGV`` through the command line's entry point in this process: its exit code and output."""
    from divopd.cli import main

    capfd.readouterr()
    code = main(list(argv))
    out = capfd.readouterr()
    return subprocess.CompletedProcess(list(argv), code, out.out, out.err)


def _cli_train(capfd: pytest.CaptureFixture[str], cfg_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli(capfd, "train", str(cfg_path), "--no-progress", *args)


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "error" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_claim_marks_new_and_empty_folders_and_refuses_foreign_ones(tmp_path: Path) -> None:
    from divopd.train.rundir import MARKER as marker

    assert marker == MARKER
    held = contextlib.ExitStack()  # the locks the claims take, let go at the end
    try:
        _claims(tmp_path, held)
    finally:
        held.close()


def _claims(tmp_path: Path, held: contextlib.ExitStack) -> None:
    from divopd.train.rundir import claim_run_dir, is_run_dir

    assert claim_run_dir(tmp_path / "new", held) is None and (tmp_path / "new" / MARKER).is_file()
    (tmp_path / "empty").mkdir()
    assert claim_run_dir(tmp_path / "empty", held) == [] and is_run_dir(tmp_path / "empty")
    before = _user_folder(tmp_path / "user")
    from divopd.errors import RunExistsError, UsageError

    with pytest.raises(UsageError, match="not a divopd run directory"):
        claim_run_dir(tmp_path / "user", held)
    assert _tree(tmp_path / "user") == before
    old = tmp_path / "old"  # a run of an older divopd (no marker): recognised by its layout, and refused as a run
    old.mkdir()
    (old / "config.yaml").write_text("x: 1\n")
    (old / "metrics.jsonl").write_text("{}\n")
    (old / "checkpoints" / "update-000002").mkdir(parents=True)
    (old / "checkpoints" / "update-000002" / "state.json").write_text("{}")
    assert is_run_dir(old)
    with pytest.raises(RunExistsError, match="--resume"):
        claim_run_dir(old, held)


def test_run_dir_into_a_users_folder_is_refused_and_nothing_changes(tiny_models: dict[str, str],  # noqa: F811
                                                                     tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "mine"
    before = _user_folder(folder)
    cfg = tiny_config(tiny_models, tmp_path / "unused", "divopd", updates=1)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    line = _one_error_line(_cli_train(capfd, tmp_path / "cfg.yaml", "--run-dir", str(folder)))
    assert "not a divopd run directory" in line and str(folder) in line
    assert _tree(folder) == before and not (folder / MARKER).exists()


def test_bad_input_into_a_users_folder_deletes_nothing(tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """A bad env argument surfaces only once the explorer builds its env: the run stops with one line, and the
    user's folder (even one holding a config.yaml, checkpoints/, experience/) keeps every file, byte for byte."""
    folder = tmp_path / "mine"
    before = _user_folder(folder)
    cfg = tiny_config(tiny_models, folder, "divopd", **{"runtime.kind": "lockstep"})
    data = cfg.model_dump(mode="json")
    data["explorer"]["env_kwargs"] = {"num_rooms": 1}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    _one_error_line(_cli_train(capfd, tmp_path / "cfg.yaml"))
    assert _tree(folder) == before


def test_bad_input_into_an_empty_folder_removes_only_what_it_wrote(tiny_models: dict[str, str],  # noqa: F811
                                                                   tmp_path: Path) -> None:
    """An empty folder the user made is claimed; a run that fails on bad input removes its own files and leaves
    the (user's) folder in place, so the corrected command runs into it again."""
    from divopd import cli

    folder = tmp_path / "mine"
    folder.mkdir()
    cfg = tiny_config(tiny_models, folder, "divopd", **{"runtime.kind": "lockstep"})
    data = cfg.model_dump(mode="json")
    data["explorer"]["env_kwargs"] = {"num_rooms": 1}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["train", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 2
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_resume_without_a_checkpoint_refuses_and_keeps_log_and_metrics(tiny_models: dict[str, str],  # noqa: F811
                                                                       tmp_path: Path,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """A run stopped before its first checkpoint: --resume has nothing to restore, says so in one line (exit 2),
    and deletes nothing (its experience log and metrics stay)."""
    run = tmp_path / "run"
    train(tiny_config(tiny_models, run, "divopd", updates=2, **{"runtime.kind": "lockstep",
                                                                "checkpoint.every": 100}))
    shutil.rmtree(run / "checkpoints")  # as a kill before the first checkpoint leaves it
    (run / "summary.json").unlink()
    before = _tree(run)
    assert any(name.startswith("experience/") for name in before) and "metrics.jsonl" in before
    proc = _cli(capfd, "train", "--resume", str(run), "--no-progress")
    line = _one_error_line(proc)
    assert "nothing to resume from" in line and f"divopd train {run}/config.yaml --run-dir {run}" in line
    assert _without_lock(_tree(run)) == _without_lock(before)
    # what the refusal's line says to do: a fresh run there, its old files moved aside, nothing deleted
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "divopd.cli", "train", str(run / "config.yaml"), "--run-dir", str(run),
                           "--no-progress"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (aside,) = run.glob("stranded-*")
    assert "held a run that stopped before its first checkpoint; its files are kept in" in proc.stderr
    assert _tree(aside) == {k: v for k, v in _without_lock(before).items() if k != MARKER}, "every old run file"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["ledger"]["received"] == sum(
        1 for _ in read_log(run / "experience")), "the fresh run's own log, not the old one's"


def _without_lock(tree: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tree.items() if k != LOCK}


def test_resume_of_a_foreign_folder_is_refused(tmp_path: Path) -> None:
    from divopd.errors import UsageError
    from divopd.train.assemble import open_run

    before = _user_folder(tmp_path / "mine")
    with pytest.raises(UsageError, match="not a divopd run directory"):
        open_run(None, resume=tmp_path / "mine")
    assert _tree(tmp_path / "mine") == before


def test_a_resumed_topk_run_counts_the_requeued_turns_and_completes(tiny_models: dict[str, str],  # noqa: F811
                                                                    tmp_path: Path) -> None:
    """learner.estimator topk under lockstep, stopped past a checkpoint with turns logged after it (its newest
    checkpoint and summary gone, as after kill -9): --resume completes; the re-queued turns, which the log holds
    without teacher top-k, are counted invalid (missing_teacher) by the gate, and the ledger identity holds. The
    checkpoint has no lockstep runtime state (as an older divopd's): with it, the turns are produced again instead."""
    run = tmp_path / "run"
    over = {"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 3,
            "checkpoint.every": 3, "checkpoint.keep": 2, "learner.estimator": "topk", "explorer.teacher_topk": 4}
    first = train(tiny_config(tiny_models, run, "divopd", updates=6, **over))
    assert_ledger_identity(first["ledger"])
    logged = list(read_log(run / "experience"))
    assert max(x.arrival_update for x in logged) > 3  # turns arrived after the checkpoint at update 3
    shutil.rmtree(run / "checkpoints" / "update-000006")
    (run / "summary.json").unlink()
    without_runtime_state(run / "checkpoints" / "update-000003")
    at_checkpoint = max(x.arrival for x in logged if x.arrival_update < 3) + 1
    requeued = sum(1 for x in logged if x.arrival >= at_checkpoint)
    assert requeued
    summary = train(resume=run)
    assert summary["resumed"] and summary["updates"] == 6
    ledger = summary["ledger"]
    assert_ledger_identity(ledger)
    assert ledger["received"] == len(list(read_log(run / "experience")))
    assert ledger["invalid_by_reason"]["missing_teacher"] > first["ledger"]["invalid_by_reason"]["missing_teacher"]
    assert [r["update"] for r in read_metrics(run) if r["kind"] == "update"] == list(range(1, 7))
