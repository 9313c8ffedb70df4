"""Shared pieces of the vLLM tests: a tiny Llama the CPU attention kernel accepts (head_dim 64), HF references, and the
SmolLM2-135M folder when one has been built (``benchmarks/build_smollm2.py``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]

#: Where ``benchmarks/build_smollm2.py`` writes SmolLM2-135M-Instruct (override with DIVOPD_SMOLLM2).
SMOLLM2 = Path(os.environ.get("DIVOPD_SMOLLM2", ROOT / "cache" / "smollm2-135m"))

#: Engine options of the tests: eager (no compile), a small KV cache, prefix caching on (the default).
ENGINE = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "kv_cache_memory_bytes": 2**27}


def tiny_llama_folder(out: Path, tokenizer: Any, seed: int = 0) -> str:
    """A random-init tiny Llama of size ``0.5m`` (head_dim 64, which the CPU attention kernel accepts) saved with
    ``tokenizer`` under ``out``."""
    from divopd.models.tiny import build_model

    build_model(tokenizer, size="0.5m", seed=seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


#: Engine options of the `divopd train` runs (room for the env's longer prompts).
RUN_ENGINE = {"max_model_len": 1100, "enforce_eager": True, "kv_cache_memory_bytes": 2**27}


def tiny_llama_pair(out: Path) -> dict[str, str]:
    """The student (seed 0) and teacher (seed 1) tiny Llamas of the `divopd train` runs, on the tiny env's tokenizer,
    saved under ``out``: ``{"student": path, "teacher": path}``."""
    from explorer_helpers import env_tokenizer

    tok = env_tokenizer("tiny")
    return {name: tiny_llama_folder(out / name, tok, seed=seed) for name, seed in (("student", 0), ("teacher", 1))}


def hf_logprobs(model: Any, prompt: list[int], response: list[int]) -> np.ndarray:
    """log π(response_i | prompt, response_<i) from one HF forward (float32)."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return np.array([lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(response)], dtype=np.float32)
