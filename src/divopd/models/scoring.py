"""No-grad scoring: the log probability a model assigns to given response tokens after given prompts (the teacher's
``π_T(y)`` of every student token, the learner's recomputed θ_old)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from divopd.experience.turn import ResponseScores
from divopd.models.packing import gather_logprobs, pack_sequences, scatter_rows, selected_logits

__all__ = ["ResponseScores", "chunks", "response_logprobs", "score_responses"]


def chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive groups of indices whose total length stays ≤ max_tokens (a longer item gets its own group)."""
    groups: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(lengths):
        if cur and total + n > max_tokens:
            groups.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += n
    if cur:
        groups.append(cur)
    return groups


@torch.no_grad()
def score_responses(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    topk: int = 0,
    max_tokens_per_batch: int = 8192,
    layout: str = "packed",
    pad_id: int = 0,
) -> list[ResponseScores]:
    """As :func:`response_logprobs`, always returning :class:`ResponseScores` (``topk_*`` None when ``topk`` = 0)."""
    if len(prompts) != len(responses):
        raise ValueError(f"score_responses: {len(prompts)} prompts but {len(responses)} responses")
    if topk < 0:
        raise ValueError(f"score_responses: topk must be >= 0, got {topk}")
    device = next(model.parameters()).device
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    out: list[ResponseScores | None] = [None] * len(prompts)
    for group in chunks(lengths, max_tokens_per_batch):
        batch = pack_sequences([prompts[i] for i in group], [responses[i] for i in group], layout=layout,
                               pad_id=pad_id).to(device)
        logits = selected_logits(model, batch)
        lp = scatter_rows(gather_logprobs(logits, batch.targets), batch, fill=float("nan")).cpu().numpy()
        if topk > 0:
            k = min(topk, logits.shape[-1])
            top_lp, top_id = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
            top_lp = scatter_rows(top_lp, batch, fill=float("nan")).cpu().numpy()
            top_id = scatter_rows(top_id, batch, fill=0).cpu().numpy()
        for j, i in enumerate(group):
            n = len(responses[i])
            top = (top_id[j, :n].astype(np.int32), top_lp[j, :n].astype(np.float32)) if topk > 0 else (None, None)
            out[i] = ResponseScores(lp[j, :n].astype(np.float32), *top)
    return out  # type: ignore[return-value]


def response_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    max_tokens_per_batch: int = 8192,
    topk: int = 0,
    layout: str = "packed",
    pad_id: int = 0,
) -> list[np.ndarray] | list[ResponseScores]:
    """Per-token log probabilities (no grad, float32) of ``responses[i]`` after ``prompts[i]`` under ``model``, at most
    ``max_tokens_per_batch`` tokens per forward pass: [L_i] arrays (NaN where there is no context), or with ``topk``
    > 0 :class:`ResponseScores` with ``topk_ids`` / ``topk_logprobs`` [L_i, k]."""
    scores = score_responses(model, prompts, responses, topk=topk, max_tokens_per_batch=max_tokens_per_batch,
                             layout=layout, pad_id=pad_id)
    return scores if topk > 0 else [s.logprobs for s in scores]
