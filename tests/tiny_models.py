"""The tests' tiny models: a random-init student and teacher sharing a word-level tokenizer built from an
environment's text (built in well under a second, offline). Shared by the default suite's fixture (``test_train``),
the Trinity-RFT and verl integration tests and the script that makes the verl tests' experience-log fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from divopd.explore.envs.tiny import build_tiny_pair, env_corpus

__all__ = ["build_env_models", "build_tiny_models", "copy_state_dict"]


def build_tiny_models(out: Path) -> dict[str, str]:
    """Save the student (seed 0) and the teacher (seed 1) under ``out/{student,teacher}``; returns their paths."""
    return build_tiny_pair(out)


def build_env_models(out: Path, env_name: str, env_kwargs: dict[str, Any]) -> dict[str, str]:
    """Like :func:`build_tiny_models`, the word tokenizer built from two short episodes of ``env_name``
    (:func:`~divopd.explore.envs.tiny.env_corpus`)."""
    return build_tiny_pair(out, texts=env_corpus(env_name, env_kwargs, episodes=2, steps=3))


def copy_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``model.state_dict()`` (a published weight version)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
