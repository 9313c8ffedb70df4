"""The tests' tiny models: a random-init student and teacher sharing a word-level tokenizer built from an
environment's text (built in well under a second, offline). Shared by the default suite's fixture (``test_train``),
the Trinity-RFT and verl integration tests and the script that makes the verl tests' experience-log fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from divopd.explore.envs.tiny import build_tiny_pair

__all__ = ["build_env_models", "build_tiny_models", "env_texts"]


def build_tiny_models(out: Path) -> dict[str, str]:
    """Save the student (seed 0) and the teacher (seed 1) under ``out/{student,teacher}``; returns their paths."""
    return build_tiny_pair(out)


def env_texts(env_name: str, env_kwargs: dict[str, Any], tasks: int = 2, steps: int = 3) -> list[str]:
    """The prompt's fixed text and what ``tasks`` short episodes of ``env_name`` show (first observation, the listed
    valid actions, the observations after cycling through them); the env is closed (its JVM ended) even on failure."""
    from divopd.explore.envs import make_env
    from divopd.explore.prompting import DEFAULT_SYSTEM, PromptConfig

    env = make_env(env_name, **env_kwargs)
    texts = [DEFAULT_SYSTEM, PromptConfig().valid_actions_prefix]
    try:
        for task in env.tasks("train")[:tasks]:
            texts.append(env.reset(task))
            for j in range(steps):
                valid = env.valid_actions() or ["look around"]
                texts.append(", ".join(valid))
                obs, _, done, _ = env.step(valid[j % len(valid)])
                texts.append(obs)
                if done:
                    break
    finally:
        env.close()
    return texts


def build_env_models(out: Path, env_name: str, env_kwargs: dict[str, Any]) -> dict[str, str]:
    """Like :func:`build_tiny_models`, the word tokenizer built from :func:`env_texts` of ``env_name``."""
    from divopd.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer(env_texts(env_name, env_kwargs), kind="word")
    paths = {}
    for name, seed in (("student", 0), ("teacher", 1)):
        build_model(tok, size="0.2m", seed=seed).save_pretrained(Path(out) / name)
        tok.save_pretrained(Path(out) / name)
        paths[name] = str(Path(out) / name)
    return paths
