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


def tiny_llama_folder(out: Path, tokenizer: Any, seed: int = 0, hidden: int = 128, heads: int = 2,
                      layers: int = 2) -> str:
    """A random-init Llama with head_dim = hidden / heads (64 by default) saved with ``tokenizer`` under ``out``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=2 * hidden,
                         max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def hf_logprobs(model: Any, prompt: list[int], response: list[int]) -> np.ndarray:
    """log π(response_i | prompt, response_<i) from one HF forward (float32)."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return np.array([lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(response)], dtype=np.float32)
