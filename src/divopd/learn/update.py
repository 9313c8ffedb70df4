"""Pieces of one learner update shared by the single-process :class:`~divopd.learn.learner.Learner` and the sharded
learner (:mod:`divopd.learn.sharded`): the loss of some rows from their log probabilities, the accumulated result of
the backward passes, and the ``learner/*`` metrics of an update."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from divopd.learn.loss import opd_loss, topk_reverse_kl_loss
from divopd.learn.rows import Rows
from divopd.learn.settings import LearnerConfig

__all__ = ["Accumulated", "batch_loss", "step_metrics"]


@dataclass
class Accumulated:
    """What :meth:`Learner.accumulate` returns: the last group's loss metrics, every group's detached pieces
    ``(idx, log π, log π_old, top-k log π, scored mask)``, tokens processed, input slots and seconds."""

    metrics: dict[str, float] = field(default_factory=dict)
    parts: list[tuple[Any, ...]] = field(default_factory=list)
    tokens: int = 0
    input_slots: int = 0
    t_fb: float = 0.0


def batch_loss(cfg: LearnerConfig, rows: Rows, idx: np.ndarray, lp: torch.Tensor, old: torch.Tensor,
               top: torch.Tensor | None, scored: torch.Tensor, weights: np.ndarray | None,
               device: torch.device) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss (and its metrics) of rows ``idx`` from their log probabilities: the configured estimator and
    reduction over rows ``idx`` only (their own row denominator)."""
    mask = torch.from_numpy(rows.mask[idx]).to(device) & scored
    teacher = torch.from_numpy(rows.teacher[idx]).to(device)
    w = None if weights is None else torch.from_numpy(weights[idx]).to(device)
    if cfg.estimator == "topk":
        t_top = torch.from_numpy(rows.topk_logprobs[idx]).to(device)
        loss, m = topk_reverse_kl_loss(top, t_top, mask, beta=cfg.beta, reduction=cfg.reduction, row_weights=w,
                                      tail=cfg.topk_tail)
        _, sampled = opd_loss(lp.detach(), old, teacher, mask, beta=cfg.beta, clip_eps=cfg.clip_eps,
                              reduction=cfg.reduction)
        m["reverse_kl"] = sampled["reverse_kl"]
        return loss, m
    return opd_loss(lp, old, teacher, mask, beta=cfg.beta, clip_eps=cfg.clip_eps, reduction=cfg.reduction,
                    row_weights=w)


def step_metrics(learner: Any, metrics: dict[str, float], *, grad_norm: float, skipped: bool, tokens: int,
                 input_slots: int, compute_s: float, t_fb: float, t_opt: float, truncated: int,
                 weights: np.ndarray | None, alpha: float | None, lr: float) -> dict[str, float]:
    """The ``learner/*`` metrics of one update (the single-process and the sharded learner report the same keys)."""
    out = {f"learner/{k}": float(v) for k, v in metrics.items()}
    out.update({
        "learner/grad_norm": grad_norm,
        "learner/tokens": float(tokens),
        "learner/tokens_total": float(learner.tokens_total),
        "learner/input_slots": float(input_slots),
        "learner/compute_s": compute_s,
        "learner/compute_s_total": learner.compute_s_total,
        "learner/version": float(learner.version),
        "learner/truncated_prompts": float(truncated),
        "learner/skipped_update": float(skipped),
        "learner/lr": lr,
        "learner/time_forward_backward_s": t_fb,
        "learner/time_optimizer_s": t_opt,
        "learner/time_other_s": compute_s - t_fb - t_opt,
    })
    if weights is not None:
        out["learner/row_weight_min"] = float(weights.min())
        out["learner/row_weight_max"] = float(weights.max())
    if alpha is not None:
        out["learner/turn_balance_alpha"] = alpha
    return out
