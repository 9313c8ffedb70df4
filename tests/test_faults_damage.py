"""Damaged and foreign files in a run directory: a damaged newest checkpoint, a user's
entries in ``checkpoints/``, a full disk at a checkpoint write, an unreadable experience-log part, a garbage line in
``metrics.jsonl``.

Real short lockstep runs on the tiny environment with random-init tiny models: one finished reference run per module,
copied per case; ``--resume`` runs as users run it (``divopd train --resume`` in a child process) where its output is
what is checked. The full-disk case fills a real small tmpfs when ``mount`` works (root), else injects ``ENOSPC``
into the checkpoint write."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from divopd.experience.log import read_log
from divopd.learn.checkpoint import checkpoint_dirs
from divopd.learn.manifest import verify_checkpoint
from divopd.train import train
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
UPDATES = 6
OVER = {"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 3,
        "checkpoint.every": 2, "checkpoint.keep": 2}


def _cli_argv_env(args: tuple[str, ...], env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
    environ = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "HF_HUB_OFFLINE": "1", **(env or {})}
    return [sys.executable, "-m", "divopd.cli", "train", *args, "--no-progress"], environ


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv, environ = _cli_argv_env(args, env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, env=environ)


def _cli_paused_at_start(*args: str) -> subprocess.Popen[str]:
    """``divopd train ARGS`` in a subprocess that stops itself (SIGSTOP, fault point ``start``) once its explorers
    are built: returned when it is stopped."""
    argv, environ = _cli_argv_env(args, {"DIVOPD_SIGSTOP_AT": "start"})
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the run never paused at its start: {proc.communicate()[1][-2000:]}")


def _resume_paused(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["update"]: r["learner/loss"] for r in read_metrics(run_dir) if r["kind"] == "update"}


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file's bytes but the run-dir lock's, which names the process holding the run."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".divopd-lock"}


@pytest.fixture(scope="module")
def reference(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A finished lockstep run: checkpoints update-000004 and update-000006, metrics of updates 1-6."""
    run = tmp_path_factory.mktemp("ref") / "run"
    summary = train(tiny_config(tiny_models, run, "divopd", updates=UPDATES, **OVER))
    assert summary["updates"] == UPDATES
    assert [p.name for p in checkpoint_dirs(run / "checkpoints")] == ["update-000004", "update-000006"]
    return run


def _copy(reference: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / "summary.json").unlink()  # stopped after its last checkpoint (as after a kill): --resume has work
    return run


def _truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


DAMAGE = {
    "model.safetensors truncated": lambda c: _truncate(c / "model.safetensors"),
    "optimizer.pt truncated": lambda c: _truncate(c / "optimizer.pt"),
    "state.json truncated": lambda c: _truncate(c / "state.json"),
    "tokenizer.json removed": lambda c: (c / "tokenizer.json").unlink(),
}


# ---------------------------------------------------------------------------------------------- checkpoint verification
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "older-without-manifest"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_checkpoint_names_the_damaged_file(reference: Path, tmp_path: Path, damage: str,
                                                  manifest: bool) -> None:
    ckpt = tmp_path / "update-000006"
    shutil.copytree(reference / "checkpoints" / "update-000006", ckpt)
    if not manifest:
        (ckpt / "manifest.json").unlink()
    assert verify_checkpoint(ckpt) is None
    DAMAGE[damage](ckpt)
    problem = verify_checkpoint(ckpt)
    assert problem is not None and problem.startswith(damage.split()[0]), problem


#: The damage the default suite resumes past in a real run; verify_checkpoint names every kind of DAMAGE (the test
#: above), and the resume is the same for each: the others run under -m slow.
RESUMED_BY_DEFAULT = "model.safetensors truncated"


@pytest.mark.parametrize("damage", [d if d == RESUMED_BY_DEFAULT else pytest.param(d, marks=pytest.mark.slow)
                                    for d in DAMAGE])
def test_resume_falls_back_past_a_damaged_checkpoint_with_one_warning(reference: Path, tmp_path: Path,
                                                                      damage: str) -> None:
    run = _copy(reference, tmp_path)
    DAMAGE[damage](run / "checkpoints" / "update-000006")
    proc = _cli("--resume", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "damaged checkpoint" in line]
    assert len(warned) == 1 and "update-000006" in warned[0] and damage.split()[0] in warned[0], proc.stderr
    assert "resuming from update-000004" in warned[0]
    # what is on disk: the damaged checkpoint kept aside, the run finished from update 4 with every record once
    assert (run / "checkpoints" / "update-000006.damaged").is_dir()
    assert [p.name for p in checkpoint_dirs(run / "checkpoints")] == ["update-000004", "update-000006"]
    assert verify_checkpoint(run / "checkpoints" / "update-000006") is None
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == UPDATES
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == len(list(read_log(run / "experience")))
    assert summary["log/unreadable_turns"] == 0
    assert _losses(run) == _losses(reference)  # exact lockstep resume from update 4: updates 5 and 6 redone


def test_resume_with_no_checkpoint_that_verifies_is_one_line_and_cuts_nothing(reference: Path,
                                                                               tmp_path: Path) -> None:
    run = _copy(reference, tmp_path)
    _truncate(run / "checkpoints" / "update-000006" / "state.json")
    (run / "checkpoints" / "update-000004" / "tokenizer.json").unlink()
    before = _tree(run)
    proc = _cli("--resume", str(run))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no checkpoint verifies" in lines[0] and "update-000006 (state.json" in lines[0]
    assert "update-000004 (tokenizer.json" in lines[0]
    assert _tree(run) == before  # metrics.jsonl, the log, the checkpoints: byte for byte


# ------------------------------------------------------------------------------------------------------ foreign entries
def test_pruning_keeps_a_users_entries_in_checkpoints(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """A user's entries added to a run's ``checkpoints/`` (a name like a checkpoint's, a file) survive pruning."""
    from divopd.train.interrupt import StopRequest

    run = tmp_path / "run"
    stop = StopRequest()
    stop.set()  # stopped at once: the run checkpoints at its start and exits
    train(tiny_config(tiny_models, run, "divopd", updates=UPDATES, **{**OVER, "checkpoint.keep": 1}), stop=stop)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["update-000000"]
    (run / "checkpoints" / "update-000001-mine").mkdir(parents=True)
    (run / "checkpoints" / "update-000001-mine" / "weights.bin").write_bytes(b"mine")
    (run / "checkpoints" / "update-notes.txt").write_text("my notes\n")
    users = {k: v for k, v in _tree(run / "checkpoints").items() if "mine" in k or "notes" in k}
    summary = train(resume=run)
    assert summary["updates"] == UPDATES
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["update-000001-mine", "update-000006", "update-notes.txt"]
    assert {k: v for k, v in _tree(run / "checkpoints").items() if "mine" in k or "notes" in k} == users


# ------------------------------------------------------------------------------------------------------------ disk full
def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_disk_full_at_a_checkpoint_write_is_one_line_and_resume_finishes(
        tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """A real full filesystem when ``mount`` works here (a 128 MiB tmpfs, room enough for the run's checks before it
    starts; filled up to less than a checkpoint while the resumed run is paused at its start, as another process
    fills a disk), else ENOSPC injected into the checkpoint write (the same error the filesystem raises)."""
    disk = tmp_path / "disk"
    real = _mount_tmpfs(disk, "128m")
    try:
        run = disk / "run"
        cfg_path = tmp_path / "cfg.yaml"
        cfg = tiny_config(tiny_models, run, "divopd", updates=UPDATES, **OVER)
        import yaml

        cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        # the first session stops (SIGKILL) during update 3, after checkpoint update-000002 is written
        first = _cli(str(cfg_path), env={"DIVOPD_SIGKILL_AT": "update:3"})
        assert first.returncode == -9, first.stderr[-2000:]
        (good,) = checkpoint_dirs(run / "checkpoints")
        before = _tree(good)
        filler = disk / "filler.bin"
        if real:  # leave less room than one checkpoint: the next checkpoint write hits ENOSPC
            st = os.statvfs(disk)
            free = st.f_bavail * st.f_frsize
            need = sum(len(v) for v in before.values())
            paused = _cli_paused_at_start("--resume", str(run))  # past the checks made before a run starts
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, free - need // 2))
            proc = _resume_paused(paused)
        else:
            proc = _resume_with_enospc(run, monkeypatch, capfd)
        assert proc.returncode == 3, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and "update-000004 could not be written (disk full" in errors[0], proc.stderr[-3000:]
        assert "newest good checkpoint is update-000002" in errors[0]
        # on disk: the older checkpoint byte for byte, nothing partial, no summary
        assert [p.name for p in (run / "checkpoints").iterdir()] == [good.name]
        assert _tree(good) == before and verify_checkpoint(good) is None
        assert not (run / "summary.json").exists()
        filler.unlink(missing_ok=True)
        train(resume=run)  # room again: the resume finishes the run
        summary = json.loads((run / "summary.json").read_text())
        assert summary["updates"] == UPDATES
        assert_ledger_identity(summary["ledger"])
        assert summary["ledger"]["received"] == len(list(read_log(run / "experience")))
        assert sorted(_losses(run)) == list(range(1, UPDATES + 1))
    finally:
        if real:
            subprocess.run(["umount", str(disk)], check=False)


# --------------------------------------------------------------------------------------------------- unreadable records
def test_an_unreadable_log_part_is_counted_in_summary(reference: Path, tmp_path: Path) -> None:
    run = _copy(reference, tmp_path)
    received = json.loads((reference / "summary.json").read_text())["ledger"]["received"]
    parts = sorted((run / "experience").glob("part-*.parquet"))
    victim = parts[0]
    rows = len(list(read_log(victim)))
    _truncate(victim)
    summary = train(resume=run)
    assert summary["log/unreadable_turns"] == rows
    assert summary["log/unreadable_parts"] == [victim.name + ".unreadable"]
    assert (run / "experience" / (victim.name + ".unreadable")).is_file()  # kept aside, not deleted
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == received
    assert len(list(read_log(run / "experience"))) + rows == received  # the ledger adds up, the log says what left


def test_a_garbage_line_in_metrics_is_dropped_and_counted_on_resume(reference: Path, tmp_path: Path) -> None:
    run = _copy(reference, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines.insert(2, "this is not json " + uuid.uuid4().hex)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    shutil.rmtree(run / "checkpoints" / "update-000006")
    with pytest.warns(UserWarning, match=r"dropping 1 malformed line\(s\) \(not JSON; line 3\)"):
        summary = train(resume=run)
    assert summary["updates"] == UPDATES
    assert _losses(run) == _losses(reference)
    assert all(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())


def _resume_with_enospc(run: Path, monkeypatch: pytest.MonkeyPatch,
                        capfd: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``divopd train --resume`` in this process, its checkpoint writes failing with ENOSPC inside the write."""
    from divopd.cli import main
    from divopd.learn import checkpoint

    def full(folder: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))

    monkeypatch.setattr(checkpoint, "write_manifest", full)
    capfd.readouterr()
    rc = main(["train", "--resume", str(run), "--no-progress"])
    monkeypatch.undo()
    out = capfd.readouterr()
    return subprocess.CompletedProcess([], rc, out.out, out.err)


def test_an_unreadable_part_past_the_checkpoint_cuts_the_requeue_there(reference: Path, tmp_path: Path) -> None:
    """A resume that queues the logged turns again (a checkpoint without runtime state): the turns past the checkpoint
    are in two parts and the first cannot be read; those after it cannot keep their arrival numbers, so they leave
    the log with one warning, and the run finishes with the ledger whole."""
    import pyarrow.parquet as pq

    from divopd.experience.log import part_files
    from test_faults_resume import without_runtime_state

    run = _copy(reference, tmp_path)
    shutil.rmtree(run / "checkpoints" / "update-000006")
    without_runtime_state(run / "checkpoints" / "update-000004")
    last = part_files(run / "experience")[-1]  # the turns of updates 5 and 6 (compacted at update 6's checkpoint)
    table = pq.read_table(last)
    half = table.num_rows // 2
    n = int(last.name.split("-")[-1].split(".")[0])
    last.unlink()
    pq.write_table(table.slice(0, half), run / "experience" / f"part-{n + 1:06d}.parquet")
    pq.write_table(table.slice(half), run / "experience" / f"part-{n + 2:06d}.parquet")
    _truncate(run / "experience" / f"part-{n + 1:06d}.parquet")
    summary = train(resume=run)
    assert summary["updates"] == UPDATES
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == len(list(read_log(run / "experience")))
