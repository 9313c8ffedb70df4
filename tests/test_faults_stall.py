"""The stall rows of the fault table (docs/concepts/faults.md): a component that stops answering (SIGSTOP)
or dies is restarted or stops the run within a configured deadline, never a run that waits forever.

Real components throughout: a Ray runtime with its explorer actors and the shared teacher actor (few CPUs), the
TextWorld-Express JVM (the learner ranks' rows: tests/test_faults_ranks.py). Each row checks what happens, what is on
disk and the ledger (identity; ``received`` equals the turns the explorers produced)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from divopd.cli import main
from divopd.errors import UsageError
from divopd.train import train
from divopd.train.assemble import open_run, run_trainer
from divopd.train.config import dump_config
from test_train import assert_ledger_identity, tiny_config, tiny_models  # noqa: F401

pytestmark = pytest.mark.timeout(900)


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until the kernel shows it stopped."""
    os.kill(pid, signal.SIGSTOP)
    status = Path(f"/proc/{pid}/status")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if "\nState:\tT" in status.read_text():
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} did not stop")


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts as exited)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def _ended_within(pids: list[int], timeout: float = 30.0) -> bool:
    """Whether every process of ``pids`` has exited within ``timeout`` seconds (it was ended, not left behind)."""
    deadline = time.monotonic() + timeout
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return all(_gone(pid) for pid in pids)


def _ckpts(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("update-*"))


class _Hook:
    """A progress hook that calls ``act(trainer)`` once, after update ``at``."""

    def __init__(self, at: int, act: Any) -> None:
        self.at, self.act, self.done = at, act, False

    def on_update(self, trainer: Any, metrics: dict) -> None:
        if trainer.version == self.at and not self.done:
            self.done = True
            self.act(trainer)

    def on_eval(self, update: int, results: dict) -> None:
        pass


# ------------------------------------------------------------------------------------------------------ no java
def test_no_java_on_path_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from divopd.explore.envs import make_env

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java
    for share in (True, False):
        with pytest.raises(UsageError) as info:
            make_env("twx", share_jvm=share)
        assert "no `java` on PATH" in str(info.value) and "\n" not in str(info.value)


def test_divopd_train_without_java_exits_2_with_one_line(tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", **{"runtime.kind": "lockstep", "explorer.env": "twx"})
    config = tmp_path / "config.yaml"
    config.write_text(dump_config(cfg))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert main(["train", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no `java` on PATH" in err and "Traceback" not in err


def test_the_watchdog_line_names_the_newest_stalled_component() -> None:
    from divopd.train.watchdog import Watchdog, note_stall

    now = [0.0]
    dog = Watchdog(10, 2, clock=lambda: now[0])
    note_stall("teacher scoring", "the shared teacher actor", "no answer for 600 s: killed for restart 1")
    note_stall("explore", "Ray explorer actor 3", "no rollout for 1200 s: killed for a restart")
    now[0] = 11.0
    line = dog.stalled_waiting("the ray runtime's 4 explorer(s)")
    assert line is not None and "\n" not in line
    assert line.endswith("last seen: stalled at explore: Ray explorer actor 3 (no rollout for 1200 s: killed for a "
                         "restart)")


# ------------------------------------------------------------------------------------- a vLLM engine call hangs
def test_a_vllm_engine_call_past_its_deadline_marks_the_engine_stalled(caplog: pytest.LogCaptureFixture) -> None:
    """An in-process engine call cannot be interrupted: past ``call_timeout_s`` the generator is marked ``stalled``
    (one error line naming the engine and the call), and the mark goes once the call returns. The engine here is a
    stand-in that blocks until released (vLLM itself runs in tests/vllm_backend where it is installed)."""
    import threading

    from divopd.explore.vllm_engine import VLLMGenerator

    gen = VLLMGenerator.__new__(VLLMGenerator)  # the guarded-call machinery only, without starting an engine
    gen.model_path, gen.call_timeout_s, gen.stalled = "stand-in", 0.05, None
    gen.restarts, gen.max_restarts, gen._lock, gen._llm = 0, 0, threading.Lock(), object()
    release, seen = threading.Event(), []

    def hang(llm: object) -> str:
        deadline = time.monotonic() + 60
        while gen.stalled is None and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(gen.stalled)
        release.wait(timeout=60)
        return "done"

    caller = threading.Thread(target=lambda: seen.append(gen._guarded("generate", hang)))
    caller.start()
    release.set()
    caller.join(timeout=60)
    assert seen[0] is not None and "stalled at generate" in seen[0] and "stand-in" in seen[0]
    assert seen[1] == "done" and gen.stalled is None
    assert any("call_timeout_s" in r.getMessage() for r in caplog.records)


def _main_thread_call(timeout_s: float, sleep_s: float) -> subprocess.CompletedProcess:
    code = ("import time\nfrom divopd.explore.call_deadline import call_deadline\nmarks = []\n"
            f"with call_deadline({timeout_s}, 'stalled at generate: the stand-in engine', marks.append):\n"
            f"    time.sleep({sleep_s})\nprint(marks)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_a_call_blocking_the_main_thread_past_twice_its_deadline_ends_the_process_with_one_line() -> None:
    """Under lockstep the engine call runs on the loop's own (main) thread, so the loop watchdog cannot act while it
    blocks: at twice the deadline the process exits 3 with one line (a real child process, a blocking stand-in call)."""
    proc = _main_thread_call(0.2, 120)
    assert proc.returncode == 3
    lines = [line for line in proc.stderr.splitlines() if line.startswith("divopd:")]
    assert len(lines) == 1 and "the stand-in engine" in lines[0] and "--resume" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_main_thread_call_that_returns_between_the_deadlines_is_only_marked() -> None:
    proc = _main_thread_call(2.0, 2.5)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['stalled at generate: the stand-in engine', None]"


# ----------------------------------------------------------------------------------------------- a JVM stops
@pytest.mark.slow
def test_a_stopped_env_jvm_in_a_run_becomes_an_env_crash_and_the_run_goes_on(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """SIGSTOP of the explorer's TextWorld-Express JVM after update 1: the env call is killed at its deadline
    (``explorer.env_kwargs.call_timeout_s``), counted as an env crash, and the run reaches its updates."""
    from divopd.explore.envs._jvm_hosts import _HOSTS

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=3, **{
        "runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 100,
        "explorer.env": "twx", "explorer.env_kwargs": "{call_timeout_s: 5, game: coin, params: 'numLocations=1'}",
        "explorer.max_steps": 3})
    trainer, _ = open_run(cfg)
    stopped: list[int] = []

    def stop_jvm(trainer: Any) -> None:
        procs = [h.env._gateway.java_process for h in _HOSTS.values()]
        stopped.extend(p.pid for p in procs)
        for pid in stopped:
            _stop(pid)

    try:
        summary = run_trainer(trainer, _Hook(1, stop_jvm))
    finally:
        for pid in stopped:
            _resume(pid)
    assert stopped and all(_gone(pid) for pid in stopped)
    assert summary["updates"] == 3
    assert_ledger_identity(summary["ledger"])


# ----------------------------------------------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def ray_session(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: F811
    ray = pytest.importorskip("ray")
    from divopd.train.runtime.ray import init_ray

    started = init_ray(tiny_config(tiny_models, tmp_path_factory.mktemp("ray"), "divopd",
                                   **{"runtime.kind": "ray", "runtime.ray_num_cpus": 2}))
    yield ray
    if started:
        ray.shutdown()


def _ray_cfg(models: dict[str, str], run_dir: Path, updates: int = 4, **over: object) -> Any:
    return tiny_config(models, run_dir, "divopd", updates=updates, **{
        "runtime.kind": "ray", "runtime.ray_num_cpus": 2, "runtime.explorer_cpus": 0.5, "eval.every": 100,
        "checkpoint.every": 2, **over})


def _named(ray: Any, prefix: str) -> Any:
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))
    return ray.get_actor(names[0])


def _run_with_an_actor_stopped(ray: Any, cfg: Any, name: str) -> tuple[dict[str, Any], int]:
    """Run ``cfg`` (4 updates) with the run's first Ray actor named ``name``-PID-... SIGSTOPped after update 1; the
    run must go on to its end, with the ledger whole. Returns the summary and the stopped actor's pid."""
    trainer, _ = open_run(cfg)
    stopped: list[int] = []

    def stop_actor(trainer: Any) -> None:
        stopped.append(ray.get(_named(ray, f"{name}-{os.getpid()}-").pid.remote(), timeout=60))
        _stop(stopped[0])

    try:
        summary = run_trainer(trainer, _Hook(1, stop_actor))
    finally:
        for pid in stopped:
            _resume(pid)
    assert summary["updates"] == 4 and "stalled" not in summary
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == summary["produced_turns"]
    return summary, stopped[0]


@pytest.mark.slow
def test_a_stopped_shared_teacher_actor_is_restarted_and_the_run_goes_on(
        ray_session: Any, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    # the deadline also bounds the restarted actor's start (a new process importing torch and loading the teacher):
    # 20 s holds it on a loaded 2-core machine, where 5 s killed every restart before it answered
    cfg = _ray_cfg(tiny_models, tmp_path / "run", **{"teacher.shared": True, "runtime.teacher_timeout_s": 20})
    summary, pid = _run_with_an_actor_stopped(ray_session, cfg, "divopd-teacher")
    assert summary["teacher_restarts"] >= 1 and _gone(pid)


@pytest.mark.slow
def test_a_stopped_explorer_actor_is_restarted_at_its_deadline(
        ray_session: Any, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    cfg = _ray_cfg(tiny_models, tmp_path / "run", **{"runtime.explorer_timeout_s": 10, "runtime.num_explorers": 1})
    summary, pid = _run_with_an_actor_stopped(ray_session, cfg, "divopd-explorer")
    assert summary["explorer_stalled_restarts"] >= 1 and _gone(pid)


@pytest.mark.slow
def test_a_dead_teacher_stops_the_run_with_a_checkpoint_and_resume_finishes_it(
        ray_session: Any, tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """The shared teacher killed for good (``runtime.max_teacher_restarts: 0``): every turn arrives unscored and
    the watchdog's teacher rule stops the run (exit 3 from the CLI), checkpointed; ``--resume`` with a live teacher
    finishes it."""
    ray = ray_session
    run_dir = tmp_path / "run"
    cfg = _ray_cfg(tiny_models, run_dir, updates=6, **{"teacher.shared": True, "runtime.max_teacher_restarts": 0,
                                            "runtime.stall_timeout_s": 600})
    trainer, _ = open_run(cfg)

    def kill_teacher(trainer: Any) -> None:
        ray.kill(_named(ray, f"divopd-teacher-{os.getpid()}-"), no_restart=True)

    summary = run_trainer(trainer, _Hook(1, kill_teacher))
    assert "teacher" in summary["stalled"] and summary["updates"] < 6
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["stalled"] == summary["stalled"]
    assert _ckpts(run_dir)[-1] == f"update-{summary['updates']:06d}"
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == summary["produced_turns"]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["runtime"]["max_teacher_restarts"] = 3
    resumed = train(type(cfg).model_validate(config), resume=run_dir)
    assert resumed["resumed"] and resumed["updates"] == 6 and "stalled" not in resumed
    assert_ledger_identity(resumed["ledger"])


def test_the_stall_keys_have_defaults_below_the_watchdog() -> None:
    """The per-component deadlines act before the loop watchdog does (their defaults are below it)."""
    from divopd.train.config import RuntimeSettings

    rt = RuntimeSettings()
    assert 0 < rt.teacher_timeout_s < rt.stall_timeout_s and 0 < rt.explorer_timeout_s < rt.stall_timeout_s
    assert 0 < rt.collective_timeout_s < rt.stall_timeout_s and rt.max_teacher_restarts >= 1
