"""A terminal's Ctrl-C reaches the whole process group.

Every child divopd starts survives the group's SIGINT and is stopped by divopd after its checkpoint: the JVMs of a
TextWorld-Express run (a process group of their own), the spawned learner ranks (SIGINT blocked). An impatient double
Ctrl-C inside a lockstep poll quits without checkpointing the half-done poll. After each, ``--resume`` of the lockstep
run equals the uninterrupted run. Every run here is a real ``divopd train`` child in a session of its own (so that its
process group is not pytest's), signalled with ``kill -INT -PGID`` as a terminal does (or, at a known moment, by
itself: ``DIVOPD_DOUBLE_CTRL_C_AT``, :func:`divopd.train.interrupt.fault_point`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from divopd.learn.checkpoint import latest_checkpoint
from test_faults_resume import _check_resumed_equals, _config, _kill_spec, _log_table, _series, reference  # noqa: F401
from test_train import assert_ledger_identity, tiny_models  # noqa: F401

TWX = {"explorer.env": "twx", "explorer.env_kwargs": '{game: coin, params: "numLocations=2,numDistractorItems=0,'
       'includeDoors=0"}', "runtime.lockstep.env_steps_per_update": 6, "eval.every": 100}
DEADLINE_S = 600.0  # generous: the verdict must not depend on machine load


def _start(cfg: Any, tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.Popen, Path]:
    """``divopd train`` on ``cfg`` (or ``args``) as the leader of a new session; its stderr goes to a file."""
    cfg_path = tmp_path / "cfg.yaml"
    if cfg is not None:
        cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    err = tmp_path / f"stderr-{uuid.uuid4().hex[:6]}.txt"
    base = {k: v for k, v in os.environ.items() if not k.startswith("DIVOPD_")}
    argv = list(args) or [str(cfg_path)]
    with err.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "divopd", "train", *argv, "--no-progress"],
                                stdout=subprocess.DEVNULL, stderr=f, start_new_session=True,
                                env={**base, "HF_HUB_OFFLINE": "1", **env})
    return proc, err


def _wait_for(check: Any, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S:g} s"
        time.sleep(0.1)


def _has_checkpoint(run_dir: Path, version: int) -> bool:
    return (run_dir / "checkpoints" / f"update-{version:06d}" / "state.json").is_file()


def _jvms(tag: str) -> list[int]:
    """The pids of the JVMs started with ``tag`` in their JAVA_TOOL_OPTIONS (this test's JVMs only)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            environ = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"JAVA_TOOL_OPTIONS=") and tag.encode() in e for e in environ):
            pids.append(int(d.name))
    return pids


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def _wait_gone(pids: list[int], timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _alive(pids)


def _finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def twx_reference(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    pytest.importorskip("textworld_express")
    from divopd.train import train

    run_dir = tmp_path_factory.mktemp("twx-reference") / "run"
    summary = train(_config(tiny_models, run_dir, 8, **TWX))
    return {"summary": summary, "series": _series(run_dir), "log": _log_table(run_dir)}


# Slow: JVM envs; by default a terminal Ctrl-C:
# test_cli_user.py::test_ctrl_c_in_a_terminal_ends_with_the_resume_command
@pytest.mark.slow
def test_a_terminal_ctrl_c_leaves_the_jvms_to_divopd_then_resume_equals_the_uninterrupted_run(
        twx_reference: dict, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """kill -INT -PGID during a TextWorld-Express lockstep run: the JVMs (own process group) do not see it; divopd
    stops at the next boundary, checkpoints, closes its envs, prints no traceback and exits 130; no JVM is left."""
    run_dir = tmp_path / "run"
    tag = f"divopd.test=ctrlc-{uuid.uuid4().hex[:8]}"
    proc, err = _start(_config(tiny_models, run_dir, 8, **TWX), tmp_path,
                       DIVOPD_JAVA_OPTS=f"-Xmx256m -XX:+UseSerialGC -D{tag}")
    try:
        _wait_for(lambda: _has_checkpoint(run_dir, 2), proc, "checkpoint update-000002")
        jvms = _alive(_jvms(tag))
        assert jvms, "the twx run's JVMs"
        assert all(os.getpgid(pid) != proc.pid for pid in jvms), "each JVM in a process group of its own"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
    finally:
        rc = _finish(proc)
    text = err.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "env crashed" not in text and "Gateway" not in text, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert_ledger_identity(summary["ledger"])
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None and int(ckpt.name.split("-")[1]) == summary["updates"]
    assert json.loads((ckpt / "state.json").read_text())["extra_state"].get("runtime"), "an exact (lockstep) state"
    assert _wait_gone(jvms) == [], "no JVM outlives the run"
    _check_resumed_equals(run_dir, twx_reference)


@pytest.mark.slow
def test_a_double_terminal_ctrl_c_with_jvms_quits_without_a_traceback_then_resume_equals(
        twx_reference: dict, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Two group SIGINTs 50 ms apart in a TextWorld-Express run: no py4j traceback (a quit waits for the JVM call in
    progress), exit 130, no JVM left, and the newest checkpoint resumes to the uninterrupted run."""
    run_dir = tmp_path / "run"
    tag = f"divopd.test=double-{uuid.uuid4().hex[:8]}"
    proc, err = _start(_config(tiny_models, run_dir, 8, **TWX), tmp_path,
                       DIVOPD_JAVA_OPTS=f"-Xmx256m -XX:+UseSerialGC -D{tag}")
    try:
        _wait_for(lambda: _has_checkpoint(run_dir, 2), proc, "checkpoint update-000002")
        jvms = _alive(_jvms(tag))
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        rc = _finish(proc)
    text = err.read_text()
    assert rc == 130 and "Traceback" not in text and "shutdown_socket" not in text, text[-3000:]
    assert _wait_gone(jvms) == []
    _check_resumed_equals(run_dir, twx_reference)


def test_a_double_ctrl_c_inside_a_poll_never_checkpoints_the_half_done_poll(
        reference: dict, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Two group SIGINTs 50 ms apart inside a lockstep poll (after update 2's checkpoint): the second quits at once,
    the half-done poll is not checkpointed (update 2 stays the newest), exit 130, one line; the resume equals the
    uninterrupted run (today's loss: ``ledger/received`` 144 vs 192)."""
    run_dir = tmp_path / "run"
    spec = _kill_spec(reference["visits"], "poll", 3)
    proc, err = _start(_config(tiny_models, run_dir), tmp_path, DIVOPD_DOUBLE_CTRL_C_AT=spec)
    rc = _finish(proc)
    text = err.read_text()
    assert rc == 130 and "Traceback" not in text, text[-3000:]
    assert text.strip().splitlines()[-2:] == ["divopd train: interrupted; continue from the newest checkpoint with:",
                                              f"divopd train --resume {run_dir}"]
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "update-000002"
    assert not (run_dir / "summary.json").exists(), "quit inside a stage: the run is unfinished, not summarised"
    _check_resumed_equals(run_dir, reference)


# Slow: spawned ranks; by default a terminal Ctrl-C:
# test_cli_user.py::test_ctrl_c_in_a_terminal_ends_with_the_resume_command
@pytest.mark.slow
def test_a_terminal_ctrl_c_leaves_the_spawned_learner_ranks_to_divopd(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """learner.world_size 2 (two spawned ranks): a group SIGINT does not reach the ranks; the driver checkpoints
    through them at the next boundary, then closes them: exit 130, no traceback, a checkpoint of the stop's update."""
    run_dir = tmp_path / "run"
    cfg = _config(tiny_models, run_dir, 8, **{"learner.world_size": 2, "eval.every": 100})
    proc, err = _start(cfg, tmp_path)
    try:
        _wait_for(lambda: _has_checkpoint(run_dir, 2), proc, "checkpoint update-000002")
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        rc = _finish(proc)
    text = err.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "learner rank" not in text, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert latest_checkpoint(run_dir / "checkpoints").name == f"update-{summary['updates']:06d}"


def test_sigkill_of_divopd_leaves_no_jvm(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """kill -9 of divopd: its JVMs (in groups of their own) still end with it (py4j's die_on_exit)."""
    pytest.importorskip("textworld_express")
    run_dir = tmp_path / "run"
    tag = f"divopd.test=kill-{uuid.uuid4().hex[:8]}"
    proc, _ = _start(_config(tiny_models, run_dir, 8, **TWX), tmp_path,
                     DIVOPD_JAVA_OPTS=f"-Xmx256m -XX:+UseSerialGC -D{tag}")
    try:
        _wait_for(lambda: bool(_alive(_jvms(tag))) and (run_dir / "metrics.jsonl").is_file(), proc, "a JVM")
        jvms = _alive(_jvms(tag))
    finally:
        proc.kill()
        proc.wait()
    assert _wait_gone(jvms) == [], "a JVM outlived divopd"


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc: parent links)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


@pytest.mark.slow
def test_a_terminal_ctrl_c_leaves_the_local_ray_processes_to_divopd(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """runtime.kind ray on a local Ray instance divopd starts: the group SIGINT reaches Ray's processes (raylet, GCS,
    workers, started SIGINT-blocked); divopd checkpoints, shuts Ray down, exits 130 without a traceback, and none of
    the Ray processes it started outlives it."""
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    cfg = _config(tiny_models, run_dir, 8, **{"runtime.kind": "ray", "runtime.ray_num_cpus": 2, "eval.every": 100})
    proc, err = _start(cfg, tmp_path, RAY_AUTH_MODE="disabled")
    children: list[int] = []
    try:
        _wait_for(lambda: _has_checkpoint(run_dir, 2), proc, "checkpoint update-000002")
        children = _descendants(proc.pid)
        assert children, "Ray started processes under divopd"
        os.killpg(proc.pid, signal.SIGINT)
    finally:
        rc = _finish(proc)
    text = err.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert_ledger_identity(summary["ledger"])
    assert latest_checkpoint(run_dir / "checkpoints").name == f"update-{summary['updates']:06d}"
    assert _wait_gone(children) == [], "Ray processes outlived the run"
