"""``examples/try_verl.py`` runs as the verl page says and prints the records verl's worker wrote and the batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[3]


def test_the_try_script_prints_one_teacher_scored_record_per_turn_and_a_batch() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "examples/try_verl.py", "--tasks", "2", "--max-steps", "3"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    head = re.search(r"(\d+) records from 2 sessions of tiny \(teacher calls: (\d+)\)", done.stdout)
    assert head and head.group(1) == head.group(2) and int(head.group(1)) > 2, done.stdout  # every turn scored
    records = re.findall(r"^  task\d_0_\d: version \d+, \d+ prompt \+ \d+ response tokens", done.stdout, re.M)
    assert len(records) == int(head.group(1))
    assert "the batch DivOPD composes for verl's trainer: ['task" in done.stdout
    assert "ledger/selected 4" in done.stdout
