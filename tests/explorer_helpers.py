"""Shared helpers for the explorer tests: a tiny word tokenizer built from an env's text, tiny random models."""

from __future__ import annotations

from functools import cache

import torch

from divopd.commands.sft import collect_gold_examples
from divopd.explore.envs import make_env
from divopd.explore.prompting import DEFAULT_SYSTEM, PromptConfig, build_messages

# One thread per process: on a shared machine, two threads under contention run tiny models several times slower.
torch.set_num_threads(1)


@cache
def env_tokenizer(env_name: str = "tiny", n_tasks: int = 40):
    """A word tokenizer covering the gold trajectories of ``n_tasks`` train tasks of ``env_name``."""
    from divopd.models.tiny import build_tokenizer

    env = make_env(env_name)
    try:
        records, _ = collect_gold_examples(env, env.tasks("train")[:n_tasks])
    finally:
        env.close()
    cfg = PromptConfig()
    texts = [DEFAULT_SYSTEM, cfg.valid_actions_prefix, "Unknown action: I'm not sure what you mean.",
             "You cannot go that way. There is no coin here."]
    for r in records:
        texts += [m["content"] for m in build_messages(cfg, r["first"], r["history"], r["valid"])] + [r["action"]]
    return build_tokenizer(texts, kind="word")


def tiny_model(tokenizer, seed: int = 0, size: str = "0.2m"):
    from divopd.models.tiny import build_model

    return build_model(tokenizer, size=size, seed=seed)
