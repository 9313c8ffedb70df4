"""Behaviour cloning (SFT, ``divopd sft``) on (prompt, response) token pairs with the learner's packing: the mean
negative log likelihood of the response tokens (include the end-of-turn token so the model learns to stop).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from divopd.models.packing import gather_logprobs, pack_sequences, selected_logits

__all__ = ["sft_loss", "train_sft"]


def sft_loss(model: torch.nn.Module, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
             layout: str = "packed", pad_id: int = 0) -> tuple[torch.Tensor, int]:
    """Mean NLL over all scored response tokens of the batch (token-mean); returns ``(loss, n_tokens)``."""
    device = next(model.parameters()).device
    packed = pack_sequences(prompts, responses, layout=layout, pad_id=pad_id).to(device)
    logits = selected_logits(model, packed)
    lp = gather_logprobs(logits, packed.targets)
    n = int(lp.numel())
    if n == 0:
        return logits.sum() * 0.0, 0
    return -lp.mean(), n


def train_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    epochs: int = 1,
    lr: float = 1e-3,
    batch_size: int = 32,
    seed: int = 0,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    packing: str = "packed",
    max_prompt_len: int | None = None,
    log_every: int = 0,
    log_fn: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train ``model`` in place on ``(prompt_ids, response_ids)`` pairs with AdamW, ``batch_size`` examples per step in
    a seeded order each epoch, prompts left-truncated to ``max_prompt_len``; every ``log_every`` steps ``log_fn`` gets
    ``sft/step``, ``sft/epoch``, ``sft/loss``, ``sft/tokens``. Returns ``steps``, ``epochs``, ``examples``, ``tokens``
    (prompt + response), ``response_tokens``, ``final_loss`` (the last epoch's mean), ``epoch_losses``, ``seconds``."""
    if not examples:
        raise ValueError("train_sft: no examples")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"train_sft: epochs and batch_size must be >= 1, got {epochs}, {batch_size}")
    pad = getattr(tokenizer, "pad_token_id", None)
    pad_id = int(pad) if pad is not None else 0
    prompts = [np.asarray(p, dtype=np.int64) for p, _ in examples]
    if max_prompt_len is not None:
        prompts = [p[-max_prompt_len:] if len(p) > max_prompt_len else p for p in prompts]
    responses = [np.asarray(r, dtype=np.int64) for _, r in examples]
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model.eval()  # dropout off, as in the learner
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    t0 = time.perf_counter()
    step = tokens = resp_tokens = 0
    epoch_losses: list[float] = []
    for epoch in range(epochs):
        order = rng.permutation(len(examples))
        losses, weights = [], []
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            loss, n = sft_loss(model, [prompts[i] for i in idx], [responses[i] for i in idx], layout=packing,
                               pad_id=pad_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            step += 1
            tokens += int(sum(len(prompts[i]) + len(responses[i]) for i in idx))
            resp_tokens += n
            losses.append(float(loss.detach()))
            weights.append(n)
            if log_every and log_fn is not None and step % log_every == 0:
                log_fn({"sft/step": step, "sft/epoch": epoch, "sft/loss": losses[-1], "sft/tokens": tokens})
        total = sum(weights)
        epoch_losses.append(float(np.dot(losses, weights) / total) if total else math.nan)
    opt.zero_grad(set_to_none=True)
    return {
        "steps": step,
        "epochs": epochs,
        "examples": len(examples),
        "tokens": tokens,
        "response_tokens": resp_tokens,
        "final_loss": epoch_losses[-1],
        "epoch_losses": epoch_losses,
        "seconds": time.perf_counter() - t0,
    }
