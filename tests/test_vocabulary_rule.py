"""Teacher and student vocabularies: a teacher whose vocabulary is neither the student's nor an
extension of it is a cross-tokenizer teacher; with ``teacher.cross_tokenizer: false``, or with a top-k estimator
(which needs a shared vocabulary), ``divopd train`` refuses it with one line and exit code 2, before any training and
leaving no run directory (every runtime loads its teacher through ``load_teacher``, which checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from divopd.models.tiny import build_model, build_tokenizer

REPO = Path(__file__).resolve().parents[1]


def _model(folder: Path, words: list[str], seed: int) -> str:
    tok = build_tokenizer(words)
    build_model(tok, size="0.2m", seed=seed).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _refused(tmp_path: Path, *sets: str) -> str:
    student = _model(tmp_path / "student", ["move east west take coin"], 0)
    teacher = _model(tmp_path / "teacher", ["open door north south look around"], 1)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "divopd", "train", "tiny", "--run-dir", str(run_dir),
           "--set", f"student.path={student}", "--set", f"teacher.path={teacher}", "--set", "updates=1",
           "--set", "explorer.env=tiny", "--set", "explorer.env_kwargs={}", "--no-progress"]
    for item in sets:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not run_dir.exists()
    return proc.stderr.strip().splitlines()[-1]


def test_a_teacher_with_another_vocabulary_and_cross_tokenizer_off_is_one_line_and_exit_2(tmp_path: Path) -> None:
    last = _refused(tmp_path, "teacher.cross_tokenizer=false")
    assert last.startswith("divopd train: error: teacher.path: ") and "different vocabulary from student.path" in last
    assert "teacher.cross_tokenizer is false" in last


def test_a_topk_estimator_with_a_cross_tokenizer_teacher_is_one_line_and_exit_2(tmp_path: Path) -> None:
    last = _refused(tmp_path, "learner.estimator=topk", "explorer.teacher_topk=4")
    assert last.startswith("divopd train: error: learner.estimator: topk") and "cross" in last
