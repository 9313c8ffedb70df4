"""What one learner update trains on: a batch's turns as padded numpy arrays (:class:`UpdateInputs`), their row
weights, and their split into micro-batches by token budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from divopd.experience.turn import Turn
from divopd.learn.settings import LearnerConfig
from divopd.learn.turnopd import turn_balance_alpha, turn_balance_weights
from divopd.models.scoring import chunks
from divopd.sampling.sampler import Batch

__all__ = ["UpdateInputs", "batch_inputs", "batch_row_weights", "micro_batches", "pad_token_id", "update_inputs"]


@dataclass
class UpdateInputs:
    """A batch's turns as arrays, one row per turn: int64 ``prompts`` (after truncation) and ``responses``; [N, L]
    ``mask`` (the effective mask) and float32 ``teacher`` log probabilities (NaN where not scored); [N, L, k] teacher
    top-k ``topk_ids`` / ``topk_logprobs`` (0 and NaN where missing) or ``None``; ``truncated_prompts``: how many the
    learner left-truncated."""

    prompts: list[np.ndarray]
    responses: list[np.ndarray]
    mask: np.ndarray
    teacher: np.ndarray
    topk_ids: np.ndarray | None
    topk_logprobs: np.ndarray | None
    truncated_prompts: int

    def __len__(self) -> int:
        return len(self.prompts)

    def take(self, idx: np.ndarray) -> UpdateInputs:
        """Rows ``idx``, padded to the same length (so their log probabilities line up with the whole batch's)."""
        return UpdateInputs([self.prompts[i] for i in idx], [self.responses[i] for i in idx], self.mask[idx],
                            self.teacher[idx], None if self.topk_ids is None else self.topk_ids[idx],
                            None if self.topk_logprobs is None else self.topk_logprobs[idx], 0)


def _has_topk(t: Turn) -> bool:
    return t.teacher_topk_ids is not None and t.teacher_topk_logprobs is not None and t.length_mismatch is None


def update_inputs(turns: Sequence[Turn], *, max_prompt_len: int | None = None, topk: int | None = None
                  ) -> UpdateInputs:
    """The arrays of ``turns``. ``topk`` not ``None``: also the teacher top-k arrays (first ``topk`` columns, all when
    0); a row with valid tokens but no top-k data raises ``ValueError`` naming the turn."""
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
        mask[r, :t.response_len] = t.valid_mask
        if t.teacher_logprobs is not None and t.length_mismatch is None:
            teacher[r, :t.response_len] = t.teacher_logprobs
    topk_ids = topk_lp = None
    if topk is not None:
        k = max([t.teacher_topk_ids.shape[1] for t in turns if _has_topk(t)] + [1]) if topk == 0 else topk
        topk_ids = np.zeros((n, max_l, k), dtype=np.int64)
        topk_lp = np.full((n, max_l, k), np.nan, dtype=np.float32)
        for r, t in enumerate(turns):
            if not _has_topk(t):
                if mask[r].any():
                    raise ValueError(
                        f"estimator 'topk' needs Turn.teacher_topk_ids/teacher_topk_logprobs; turn {t.key} has none "
                        "(score the teacher with topk > 0)")
                continue
            kk = min(k, t.teacher_topk_ids.shape[1], t.teacher_topk_logprobs.shape[1])
            topk_ids[r, :t.response_len, :kk] = t.teacher_topk_ids[:, :kk]
            topk_lp[r, :t.response_len, :kk] = t.teacher_topk_logprobs[:, :kk]
    return UpdateInputs(prompts, responses, mask, teacher, topk_ids, topk_lp, truncated)


def batch_inputs(batch: Batch | Sequence[Turn] | None, config: LearnerConfig, vocab: int
                 ) -> tuple[list[Turn], UpdateInputs]:
    """A batch's turns and their inputs, every token id checked against a vocabulary of ``vocab`` ids."""
    if batch is None:
        raise ValueError("Learner.step: batch is None (the sampler was not ready; call next_batch again later)")
    turns = list(getattr(batch, "payloads", batch))  # a Batch (its payloads are the turns), or the turns
    if not turns:
        raise ValueError("Learner.step: empty batch (the sampler returns None, not an empty batch, when not ready)")
    inputs = update_inputs(turns, max_prompt_len=config.max_prompt_len,
                           topk=config.topk if config.estimator == "topk" else None)
    for t, p, r in zip(turns, inputs.prompts, inputs.responses, strict=True):
        for name, ids in (("prompt_ids", p), ("response_ids", r)):
            if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
                raise ValueError(f"Learner.step: turn {t.key} has {name} outside the model's vocabulary "
                                 f"[0, {vocab}) (min {ids.min()}, max {ids.max()}): tokenizer/model mismatch?")
    return turns, inputs


def batch_row_weights(batch: Batch | Sequence[Turn], inputs: UpdateInputs, config: LearnerConfig, version: int
                      ) -> tuple[np.ndarray | None, float | None]:
    """An update's per-row loss weights and TurnOPD's α: ``Batch.row_weights`` (``divopd-focus``) times TurnOPD's
    schedule at learner ``version`` (``turn_balance_updates``); ``(None, None)`` = unit weights (the paper's loss)."""
    n = len(inputs)
    given = getattr(batch, "row_weights", None)
    weights = None
    if given is not None:
        weights = np.asarray(given, dtype=np.float64)
        if weights.shape != (n,) or not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"Learner.step: Batch.row_weights must be {n} finite weights >= 0")
    alpha = None
    if config.turn_balance_updates is not None:
        alpha = turn_balance_alpha(version, config.turn_balance_updates)
        balance = turn_balance_weights(inputs.mask.sum(axis=1), alpha)
        weights = balance if weights is None else weights * balance
    return weights, alpha


def pad_token_id(model: Any, tokenizer: Any) -> int:
    """The id packed inputs are padded with: the tokenizer's pad token, else the model config's, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    return int(pad) if pad is not None else 0


def micro_batches(inputs: UpdateInputs, max_tokens: int) -> list[np.ndarray]:
    """Row indices of consecutive micro-batches of at most ``max_tokens`` tokens each (all rows when it is <= 0)."""
    n = len(inputs)
    if max_tokens <= 0 or n == 0:
        return [np.arange(n)]
    lengths = [len(p) + len(r) for p, r in zip(inputs.prompts, inputs.responses, strict=True)]
    return [np.asarray(group) for group in chunks(lengths, max_tokens)]
