"""Action generation: one response per prompt, batched across env instances, with per-token generating log probs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["Generation", "GenerationBackend", "HFGenerator", "stop_token_ids"]


@dataclass
class Generation:
    """One generated response: its token ids (up to and including the stop token when one came), ``logprobs``
    ([len(response_ids)] float32, log π(token | prefix) at temperature 1) and whether it ``stopped`` on a stop token
    (False: cut at ``max_new_tokens``)."""

    response_ids: list[int]
    logprobs: np.ndarray
    stopped: bool


class GenerationBackend(Protocol):
    """What the explorer needs from a generator."""

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]: ...


def stop_token_ids(tokenizer: Any, stop_on_newline: bool = True) -> list[int]:
    """End-of-sequence plus, with ``stop_on_newline``, every token whose text holds a newline (actions are one line)."""
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    if stop_on_newline:
        special = set(tokenizer.all_special_ids)
        ids += [i for i in range(len(tokenizer)) if i not in special and "\n" in tokenizer.decode([i])]
    if not ids:
        raise ValueError("stop_token_ids: the tokenizer has no eos token and stop_on_newline is off: nothing stops")
    return sorted(set(ids))


class HFGenerator:
    """Batched HF ``generate`` for one model (student or teacher)."""

    def __init__(self, model: Any, tokenizer: Any, *, stop_on_newline: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, stop_on_newline)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("HFGenerator: the tokenizer has neither a pad nor an eos token")
        self.pad_id = int(pad)

    @torch.no_grad()  # not inference_mode: tensors made there cannot be saved for a later backward
    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool = False, temperature: float = 1.0,
                 max_new_tokens: int = 16, seed: int | None = None) -> list[Generation]:
        """One response per prompt, sampled from the full distribution (``top_k=0``, ``top_p=1``); the log probs come
        from the raw logits (``output_logits``: T = 1, unwarped). ``seed`` leaves the global RNG untouched."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("HFGenerator.generate: empty prompt")
        if not greedy and temperature <= 0:
            raise ValueError(f"HFGenerator.generate: temperature must be > 0 when sampling, got {temperature}")
        from transformers import GenerationConfig

        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # (B, T) left-padded
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
            attention[row, width - len(prompt):] = 1
        sampling = {} if greedy else {"temperature": float(temperature), "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            do_sample=not greedy, max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
            output_logits=True, return_dict_in_generate=True, **sampling,
        )
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                      generation_config=config)
        new_tokens = out.sequences[:, width:].cpu()  # (B, S)
        # log π(y_s | ·) from the raw logits, one step at a time (a [B, S, V] stack is large for real vocabularies)
        per_step = [
            torch.log_softmax(logits.float(), dim=-1).gather(1, new_tokens[:, s : s + 1].to(logits.device)).squeeze(1)
            for s, logits in enumerate(out.logits)
        ]
        logprobs = torch.stack(per_step, dim=1).cpu() if per_step else torch.zeros((len(prompts), 0))  # (B, S)
        return [self._cut(new_tokens[row].tolist(), logprobs[row].numpy()) for row in range(len(prompts))]

    def _cut(self, tokens: list[int], logprobs: np.ndarray) -> Generation:
        """Keep the tokens up to and including the first stop token (what follows is padding)."""
        stops = set(self.stop_ids)
        for i, t in enumerate(tokens):
            if t in stops:
                return Generation(tokens[: i + 1], logprobs[: i + 1].astype(np.float32), True)
        return Generation(tokens, logprobs.astype(np.float32), False)
