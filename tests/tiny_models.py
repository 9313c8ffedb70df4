"""The tests' tiny models: a random-init student and teacher sharing a word-level tokenizer built from the tiny
environment's text (built in well under a second, offline). Shared by the default suite's fixture (``test_train``),
the Trinity-RFT integration tests and the script that makes the verl tests' experience-log fixture."""

from __future__ import annotations

from pathlib import Path

from divopd.explore.envs.tiny import build_tiny_pair

__all__ = ["build_tiny_models"]


def build_tiny_models(out: Path) -> dict[str, str]:
    """Save the student (seed 0) and the teacher (seed 1) under ``out/{student,teacher}``; returns their paths."""
    return build_tiny_pair(out)
