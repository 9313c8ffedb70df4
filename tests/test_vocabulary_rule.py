"""Teacher and student vocabularies: a teacher whose vocabulary is neither the student's nor an
extension of it is a cross-tokenizer teacher; with ``teacher.cross_tokenizer: false``, or with a top-k estimator
(which needs a shared vocabulary), ``divopd train`` refuses it with one line and exit code 2, before any training and
leaving no run directory (every runtime loads its teacher through ``load_teacher``, which checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from divopd.cli import main
from divopd.models.tiny import build_model, build_tokenizer


def _model(folder: Path, words: list[str], seed: int) -> str:
    tok = build_tokenizer(words)
    build_model(tok, size="0.2m", seed=seed).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> str:
    """``divopd train`` in this process (the command line's own entry point, its exit code and stderr)."""
    student = _model(tmp_path / "student", ["move east west take coin"], 0)
    teacher = _model(tmp_path / "teacher", ["open door north south look around"], 1)
    run_dir = tmp_path / "run"
    args = ["train", "tiny", "--run-dir", str(run_dir),
           "--set", f"student.path={student}", "--set", f"teacher.path={teacher}", "--set", "updates=1",
           "--set", "explorer.env=tiny", "--set", "explorer.env_kwargs={}", "--no-progress"]
    for item in sets:
        args += ["--set", item]
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "Traceback" not in err and not run_dir.exists()
    return err.strip().splitlines()[-1]


def test_a_teacher_with_another_vocabulary_and_cross_tokenizer_off_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    last = _refused(tmp_path, capsys, "teacher.cross_tokenizer=false")
    assert last.startswith("divopd train: error: teacher.path: ") and "different vocabulary from student.path" in last
    assert "teacher.cross_tokenizer is false" in last


def test_a_topk_estimator_with_a_cross_tokenizer_teacher_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    last = _refused(tmp_path, capsys, "learner.estimator=topk", "explorer.teacher_topk=4")
    assert last.startswith("divopd train: error: learner.estimator: topk") and "cross" in last
