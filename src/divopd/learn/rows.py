"""Learner rows: the per-turn arrays one update trains on (step 1 of :class:`~divopd.learn.learner.Learner.step`), and
their split into micro-batches by token budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from divopd.experience.turn import Turn

__all__ = ["Rows", "prepare_rows"]


@dataclass
class Rows:
    """A batch's rows as arrays (numpy), ready to pack.

    Attributes:
        prompts, responses: per row int64 token ids (prompts after truncation).
        mask: [N, L] bool, the effective mask (action ∧ teacher-valid ∧ finite teacher logprob), False past a row.
        teacher: [N, L] float32 teacher log probabilities (NaN where not scored / past a row).
        topk_ids, topk_logprobs: [N, L, k] teacher top-k (ids 0 and NaN where missing), or ``None``.
        truncated_prompts: number of prompts the learner left-truncated.
    """

    prompts: list[np.ndarray]
    responses: list[np.ndarray]
    mask: np.ndarray
    teacher: np.ndarray
    topk_ids: np.ndarray | None
    topk_logprobs: np.ndarray | None
    truncated_prompts: int


def prepare_rows(turns: Sequence[Turn], *, max_prompt_len: int | None = None, topk: int | None = None) -> Rows:
    """Rows of the learner batch. ``topk`` not ``None``: also collect the teacher top-k arrays (first ``topk`` columns,
    all when 0); a row with valid tokens but no top-k data raises ``ValueError`` naming the turn."""
    n = len(turns)
    max_l = max([t.response_len for t in turns] + [1])
    mask = np.zeros((n, max_l), dtype=bool)
    teacher = np.full((n, max_l), np.nan, dtype=np.float32)
    prompts, responses = [], []
    truncated = 0
    for r, t in enumerate(turns):
        p = t.prompt_ids.astype(np.int64)
        if max_prompt_len is not None and not t.prompt_truncated and len(p) > max_prompt_len:
            p = p[-max_prompt_len:]
            truncated += 1
        prompts.append(p)
        responses.append(t.response_ids.astype(np.int64))
        ln = t.response_len
        mask[r, :ln] = t.valid_mask
        if t.teacher_logprobs is not None and t.length_mismatch is None:
            teacher[r, :ln] = t.teacher_logprobs
    topk_ids = topk_lp = None
    if topk is not None:
        ks = [t.teacher_topk_ids.shape[1] for t in turns
              if t.teacher_topk_ids is not None and t.teacher_topk_logprobs is not None and t.length_mismatch is None]
        k = max(ks + [1]) if topk == 0 else topk
        topk_ids = np.zeros((n, max_l, k), dtype=np.int64)
        topk_lp = np.full((n, max_l, k), np.nan, dtype=np.float32)
        for r, t in enumerate(turns):
            has = t.teacher_topk_ids is not None and t.teacher_topk_logprobs is not None and t.length_mismatch is None
            if not has:
                if mask[r].any():
                    raise ValueError(
                        f"estimator 'topk' needs Turn.teacher_topk_ids/teacher_topk_logprobs; turn {t.key} has none "
                        "(score the teacher with topk > 0)")
                continue
            kk = min(k, t.teacher_topk_ids.shape[1], t.teacher_topk_logprobs.shape[1])
            ln = t.response_len
            topk_ids[r, :ln, :kk] = t.teacher_topk_ids[:, :kk]
            topk_lp[r, :ln, :kk] = t.teacher_topk_logprobs[:, :kk]
    return Rows(prompts, responses, mask, teacher, topk_ids, topk_lp, truncated)


def _micro_batches(rows: Rows, max_tokens: int) -> list[np.ndarray]:
    n = len(rows.prompts)
    if max_tokens <= 0 or n == 0:
        return [np.arange(n)]
    groups, cur, total = [], [], 0
    for i in range(n):
        ln = len(rows.prompts[i]) + len(rows.responses[i])
        if cur and total + ln > max_tokens:
            groups.append(np.asarray(cur))
            cur, total = [], 0
        cur.append(i)
        total += ln
    groups.append(np.asarray(cur))
    return groups
