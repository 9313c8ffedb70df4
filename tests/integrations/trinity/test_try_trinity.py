"""``examples/try_trinity.py`` runs as the Trinity page says and prints the experiences Trinity's runner produced and
the batch the ``divopd`` strategy composes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trinity")

ROOT = Path(__file__).resolve().parents[3]


def test_the_try_script_prints_one_teacher_scored_experience_per_turn_and_a_batch() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, "examples/try_trinity.py", "--tasks", "2", "--max-steps", "3"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    head = re.search(r"(\d+) experiences from 2 runs of tiny \(teacher scorings: (\d+)\)", done.stdout)
    assert head and head.group(1) == head.group(2) and int(head.group(1)) > 2, done.stdout  # every turn scored
    turns = re.findall(r"^  task \d+ turn \d+: version 0, \d+ prompt \+ \d+ response tokens, action .*, teacher "
                       r"mean log prob -?\d+\.\d+$", done.stdout, re.M)
    assert len(turns) == int(head.group(1)), done.stdout
    assert "the batch DivOPD composes for Trinity's trainer: ['task " in done.stdout
    assert "ledger/received " + head.group(1) in done.stdout and "ledger/selected 4" in done.stdout
    assert "Writing model shards" not in done.stderr and "Generating train split" not in done.stderr
