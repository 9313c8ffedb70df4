"""The tests' tiny models: a random-init student and teacher sharing a word-level tokenizer built from the tiny
environment's text (built in well under a second, offline). Shared by the default suite's fixture (``test_train``),
the Trinity-RFT integration tests and the script that makes the verl tests' experience-log fixture."""

from __future__ import annotations

from pathlib import Path

from divopd.explore.envs import make_env
from divopd.models.tiny import build_model, build_tokenizer

__all__ = ["build_tiny_models"]


def build_tiny_models(out: Path) -> dict[str, str]:
    """Save the student (seed 0) and the teacher (seed 1) under ``out/{student,teacher}``; returns their paths."""
    env = make_env("tiny")
    texts = ["You are an agent. Valid actions: move east west take coin"]
    for task in env.tasks("train")[:30]:
        texts.append(env.reset(task))
        for action in env.gold_actions(task) or []:
            texts += [action, env.step(action)[0]]
    tok = build_tokenizer(texts)
    paths = {}
    for name, seed in (("student", 0), ("teacher", 1)):
        model = build_model(tok, size="0.2m", seed=seed)
        model.save_pretrained(out / name)
        tok.save_pretrained(out / name)
        paths[name] = str(out / name)
    return paths
