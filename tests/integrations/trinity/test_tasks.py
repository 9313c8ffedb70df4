"""``divopd tasks --for trinity``: the file Trinity's taskset reads (``load_dataset(folder, split=...)``) gives back
the rows ``task_rows`` built; bad input is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("datasets")

from datasets import load_dataset  # noqa: E402

from divopd.commands.tasks import task_rows  # noqa: E402
from divopd.integrations.trinity_tasks import read_row  # noqa: E402
from divopd.train.config import load_config  # noqa: E402

ARGS = ["tiny", "--set", "explorer.env=tiny", "--set", "explorer.env_kwargs={}", "--method", "divopd-r"]


def _divopd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "divopd.cli", "tasks", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_trinity_reads_back_the_rows(tmp_path: Path) -> None:
    out = tmp_path / "tasks" / "train.jsonl"
    out.parent.mkdir()
    done = _divopd(*ARGS, "--for", "trinity", "--split", "train", "--out", str(out), "--limit", "5")
    assert done.returncode == 0, done.stderr
    rows = [read_row(r) for r in load_dataset(str(out.parent), split="train")]
    cfg = load_config("tiny", ["method=divopd-r", "explorer.env=tiny", "explorer.env_kwargs={}"])
    assert rows == task_rows(cfg, "train", 5)
    assert [r["index"] for r in rows] == list(range(5)) and rows[0]["explorer"]["recovery"]["enabled"] is True
    assert {"env", "env_kwargs", "split", "task", "index", "max_steps"} <= set(rows[0])


@pytest.mark.parametrize(("extra", "message"), [
    (["--split", "nope"], "--split 'nope'"),
    (["--split", "train", "--limit", "0"], "--limit must be >= 1"),
])
def test_bad_input_is_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    done = _divopd(*ARGS, "--for", "trinity", "--out", str(tmp_path / "train.jsonl"), *extra)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_an_existing_file_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    out.write_text("mine\n")
    done = _divopd(*ARGS, "--for", "trinity", "--split", "train", "--out", str(out))
    assert done.returncode == 2 and "exists" in done.stderr and out.read_text() == "mine\n"
