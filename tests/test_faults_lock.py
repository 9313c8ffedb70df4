"""Two processes on one run directory: the run directory's OS lock (:mod:`divopd.train.runlock`).

Real concurrent ``divopd train`` processes: a second fresh run into the same ``--run-dir`` and a second ``--resume``
are refused with one line naming the holder's pid (exit 2) while the first goes on undisturbed; a SIGKILLed holder
leaves no stale lock (the kernel drops it with the process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from divopd.experience.log import read_log
from divopd.train.runlock import LOCK, RunLockedError, lock_run_dir, release_run_dir
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

DEADLINE_S = 600.0


def _cmd(*args: str, **env: str) -> list[str]:
    return [sys.executable, "-m", "divopd", "train", *args, "--no-progress"]


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DIVOPD_")}
    return {**base, "HF_HUB_OFFLINE": "1", **extra}


def _write(cfg: object, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))  # type: ignore[attr-defined]
    return path


def _wait_holding(run_dir: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``proc`` holds the lock (the lock file names it; a divopd without a lock: it writes its metrics)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        lock = run_dir / LOCK
        if lock.is_file() and f"pid {proc.pid} " in lock.read_text():
            return
        if not lock.exists() and (run_dir / "metrics.jsonl").is_file():
            return
        time.sleep(0.05)


def _refused_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_the_lock_is_one_process_at_a_time_and_reentrant_in_it(tmp_path: Path) -> None:
    lock_run_dir(tmp_path)
    lock_run_dir(tmp_path)  # the same process: taken again
    other = subprocess.run([sys.executable, "-c", "import sys; from divopd.train.runlock import lock_run_dir; "
                            f"lock_run_dir({str(tmp_path)!r})"], capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and f"pid {os.getpid()} on" in other.stderr and "RunLockedError" in other.stderr
    release_run_dir(tmp_path)
    done = subprocess.run([sys.executable, "-c", "from divopd.train.runlock import lock_run_dir; "
                           f"lock_run_dir({str(tmp_path)!r})"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert issubclass(RunLockedError, Exception)


def test_a_second_fresh_run_into_the_same_run_dir_is_refused_naming_the_holder(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    run_dir = tmp_path / "run"
    first = _write(tiny_config(tiny_models, run_dir, "divopd", updates=4, seed=0), tmp_path / "a.yaml")
    second = _write(tiny_config(tiny_models, run_dir, "divopd", updates=4, seed=1), tmp_path / "b.yaml")
    a = subprocess.Popen(_cmd(str(first)), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_holding(run_dir, a)
        a.send_signal(signal.SIGSTOP)  # a slow first run (a model load, say): it holds the lock, writes nothing now
        b = subprocess.run(_cmd(str(second)), env=_env(), capture_output=True, text=True, timeout=DEADLINE_S)
        a.send_signal(signal.SIGCONT)
        out_a = a.communicate(timeout=DEADLINE_S)[1]
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    line = _refused_line(b)
    assert f"{run_dir} is in use by another divopd process (pid {a.pid} on" in line
    assert a.returncode == 0, out_a[-3000:]
    # on disk: the first run alone (one seed, each update once, every received turn logged once)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["seed"] == 0 and summary["updates"] == 4
    assert [r["update"] for r in read_metrics(run_dir) if r["kind"] == "update"] == list(range(1, 5))
    assert [t.arrival for t in read_log(run_dir / "experience")] == list(range(summary["ledger"]["received"]))
    assert_ledger_identity(summary["ledger"])


# Slow: four runs; by default the refusal: test_a_second_fresh_run_into_the_same_run_dir_is_refused_naming_the_holder
@pytest.mark.slow
def test_a_second_resume_is_refused_and_a_killed_holder_leaves_no_stale_lock(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    run_dir = tmp_path / "run"
    cfg = _write(tiny_config(tiny_models, run_dir, "divopd", updates=6, **{"checkpoint.every": 2}),
                 tmp_path / "c.yaml")
    stopped = subprocess.run(_cmd(str(cfg)), env=_env(DIVOPD_SIGINT_AT="update:3"), capture_output=True, text=True,
                             timeout=DEADLINE_S)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    a = subprocess.Popen(_cmd("--resume", str(run_dir)), env=_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        _wait_holding(run_dir, a)
        a.send_signal(signal.SIGSTOP)
        b = subprocess.run(_cmd("--resume", str(run_dir)), env=_env(), capture_output=True, text=True,
                           timeout=DEADLINE_S)
        a.send_signal(signal.SIGKILL)  # the holder dies: its lock goes with it
        a.wait(timeout=60)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert f"in use by another divopd process (pid {a.pid} on" in _refused_line(b)
    c = subprocess.run(_cmd("--resume", str(run_dir)), env=_env(), capture_output=True, text=True, timeout=DEADLINE_S)
    assert c.returncode == 0, c.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 6
    assert_ledger_identity(summary["ledger"])
    updates = [r["update"] for r in read_metrics(run_dir) if r["kind"] == "update"]
    assert updates == list(range(1, 7)), "each update recorded once"
