"""What both learners (one process, and sharded) share: the loss of some rows from their log probabilities, the
micro-batches' outputs, a rank's reply, what an update reports, and the counters, publication and checkpoint folder."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import torch

from divopd.experience.turn import Turn
from divopd.learn.checkpoint import STATE_FILE, WeightHandle, atomic_dir
from divopd.learn.inputs import UpdateInputs
from divopd.learn.lora import adapter_settings, published_weights, save_weights
from divopd.learn.loss import opd_loss, topk_reverse_kl_loss
from divopd.learn.settings import LearnerConfig
from divopd.learn.turnopd import DepthStats
from divopd.models.packing import gather_logprobs, pack_sequences, scatter_rows, selected_logits

__all__ = ["Accumulated", "ForwardPass", "LearnerCounters", "MicroBatchOutput", "RankStep", "UpdateStats", "batch_loss",
           "forward_pass", "whole_batch_metrics"]

A = TypeVar("A", torch.Tensor, np.ndarray)


class ForwardPass(NamedTuple):
    """One forward pass over some rows: log π of their response tokens [n, L], the student's log probs at the teacher
    top-k ids ([n, L, k] or ``None``), the scored mask [n, L], tokens processed and input slots."""

    logprobs: torch.Tensor
    topk_logprobs: torch.Tensor | None
    scored: torch.Tensor
    tokens: int
    input_slots: int


def forward_pass(model: torch.nn.Module, inputs: UpdateInputs, idx: np.ndarray, *, layout: str, pad_id: int,
                 device: torch.device, with_topk: bool = False) -> ForwardPass:
    """Rows ``idx`` of ``inputs`` packed (``layout``) and scored by ``model``, padded to the batch's length L."""
    packed = pack_sequences([inputs.prompts[i] for i in idx], [inputs.responses[i] for i in idx], layout=layout,
                            pad_id=pad_id).to(device)
    logits = selected_logits(model, packed)  # [K, V]: response positions only
    L = inputs.mask.shape[1]
    lp = scatter_rows(gather_logprobs(logits, packed.targets), packed)
    lp = torch.nn.functional.pad(lp, (0, L - lp.shape[1]))
    scored = torch.nn.functional.pad(packed.scored, (0, L - packed.scored.shape[1]))
    top = None
    if with_topk:
        ids_K = torch.from_numpy(inputs.topk_ids[idx]).to(device)[packed.seq_index, packed.token_index]  # [K, k]
        top = scatter_rows(gather_logprobs(logits, ids_K), packed, fill=float("nan"))
        top = torch.nn.functional.pad(top, (0, 0, 0, L - top.shape[1]), value=float("nan"))
    return ForwardPass(lp, top, scored, packed.tokens, packed.input_tokens)


@dataclass(frozen=True)
class MicroBatchOutput(Generic[A]):
    """One micro-batch's detached [n, L] results by row index (torch on a learner, numpy in a rank's reply);
    ``topk_logprobs``: ``None`` without the top-k estimator."""

    idx: np.ndarray
    logprobs: A
    old_logprobs: A
    topk_logprobs: A | None
    scored: A


@dataclass
class Accumulated:
    """What :meth:`~divopd.learn.learner.Learner.accumulate` returns (``metrics``: the last micro-batch's)."""

    metrics: dict[str, float] = field(default_factory=dict)
    outputs: list[MicroBatchOutput[torch.Tensor]] = field(default_factory=list)
    tokens: int = 0
    input_slots: int = 0
    t_fb: float = 0.0


def batch_loss(cfg: LearnerConfig, inputs: UpdateInputs, idx: np.ndarray, lp: torch.Tensor, old: torch.Tensor,
               top: torch.Tensor | None, scored: torch.Tensor, weights: np.ndarray | None,
               device: torch.device) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss and metrics of rows ``idx`` from their log probabilities (over their own row denominator)."""
    mask = torch.from_numpy(inputs.mask[idx]).to(device) & scored
    teacher = torch.from_numpy(inputs.teacher[idx]).to(device)
    w = None if weights is None else torch.from_numpy(weights[idx]).to(device)
    if cfg.estimator == "topk":
        t_top = torch.from_numpy(inputs.topk_logprobs[idx]).to(device)
        loss, m = topk_reverse_kl_loss(top, t_top, mask, beta=cfg.beta, reduction=cfg.reduction, row_weights=w,
                                      tail=cfg.topk_tail)
        _, sampled = opd_loss(lp.detach(), old, teacher, mask, beta=cfg.beta, clip_eps=cfg.clip_eps,
                              reduction=cfg.reduction)
        m["reverse_kl"] = sampled["reverse_kl"]
        return loss, m
    return opd_loss(lp, old, teacher, mask, beta=cfg.beta, clip_eps=cfg.clip_eps, reduction=cfg.reduction,
                    row_weights=w)


def whole_batch_metrics(cfg: LearnerConfig, inputs: UpdateInputs, outputs: Sequence[MicroBatchOutput[Any]],
                        weights: np.ndarray | None, device: torch.device) -> dict[str, float]:
    """The loss metrics of the whole batch from its micro-batches' outputs (``idx`` into ``inputs``), in row order."""
    order = np.argsort(np.concatenate([o.idx for o in outputs]))

    def cat(parts: list[Any]) -> torch.Tensor | None:
        if parts[0] is None:
            return None
        if isinstance(parts[0], torch.Tensor):
            return torch.cat(parts)[order].to(device)
        return torch.from_numpy(np.concatenate(parts)[order]).to(device)

    with torch.no_grad():
        _, metrics = batch_loss(cfg, inputs, np.arange(len(inputs)), cat([o.logprobs for o in outputs]),
                                cat([o.old_logprobs for o in outputs]), cat([o.topk_logprobs for o in outputs]),
                                cat([o.scored for o in outputs]), weights, device)
    return metrics


@dataclass(frozen=True)
class RankStep:
    """One rank's reply to an update (:meth:`divopd.learn.dist_worker.RankWorker.step`): its micro-batches' outputs
    (row indices local to its part), counts, timings, the global gradient norm and its peak memory."""

    outputs: list[MicroBatchOutput[np.ndarray]]
    tokens: int
    input_slots: int
    t_fb: float
    t_opt: float
    grad_norm: float
    skipped: bool
    peak_rss_mb: float = 0.0
    peak_cuda_mb: float = 0.0


@dataclass(frozen=True)
class UpdateStats:
    """What one learner update reports; :meth:`metrics` is its flat ``learner/*`` dict. ``loss``: the loss function's
    metrics of the whole batch; the totals and ``version``: after the update; ``row_weights`` / ``alpha``: ``None`` =
    unit weights / TurnOPD off."""

    loss: dict[str, float]
    grad_norm: float
    skipped: bool
    tokens: int
    tokens_total: int
    input_slots: int
    compute_s: float
    compute_s_total: float
    version: int
    truncated_prompts: int
    lr: float
    time_forward_backward_s: float
    time_optimizer_s: float
    row_weights: np.ndarray | None = None
    alpha: float | None = None

    def metrics(self) -> dict[str, float]:
        """The update's ``learner/*`` metrics, as ``metrics.jsonl`` records them."""
        out = {f"learner/{k}": float(v) for k, v in self.loss.items()}
        out.update({
            "learner/grad_norm": self.grad_norm,
            "learner/tokens": float(self.tokens),
            "learner/tokens_total": float(self.tokens_total),
            "learner/input_slots": float(self.input_slots),
            "learner/compute_s": self.compute_s,
            "learner/compute_s_total": self.compute_s_total,
            "learner/version": float(self.version),
            "learner/truncated_prompts": float(self.truncated_prompts),
            "learner/skipped_update": float(self.skipped),
            "learner/lr": self.lr,
            "learner/time_forward_backward_s": self.time_forward_backward_s,
            "learner/time_optimizer_s": self.time_optimizer_s,
            "learner/time_other_s": self.compute_s - self.time_forward_backward_s - self.time_optimizer_s,
        })
        if self.row_weights is not None:
            out["learner/row_weight_min"] = float(self.row_weights.min())
            out["learner/row_weight_max"] = float(self.row_weights.max())
        if self.alpha is not None:
            out["learner/turn_balance_alpha"] = self.alpha
        return out


class LearnerCounters:
    """The counters, update record, publication and checkpoint folder both learners share."""

    config: LearnerConfig
    tokenizer: Any

    def _start(self, config: LearnerConfig) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        self.version = 0
        self.tokens_total = 0
        self.compute_s_total = 0.0
        self.skipped_updates = 0
        self.depth_stats = DepthStats() if config.depth_stats else None
        self.failed: str | None = None
        self.last_update: UpdateStats | None = None  # what the newest update reported

    def _record(self, turns: Sequence[Turn], compute_s: float, **stats: Any) -> dict[str, float]:
        """Count an update of ``compute_s`` seconds (``stats``: the rest of its :class:`UpdateStats`); its metrics."""
        self.tokens_total += stats["tokens"]
        self.compute_s_total += compute_s
        self.last_update = UpdateStats(compute_s=compute_s, tokens_total=self.tokens_total,
                                       compute_s_total=self.compute_s_total, version=self.version, **stats)
        if self.depth_stats is not None:
            self.depth_stats.update(turns)
        return self.last_update.metrics()

    def _publish(self, model: torch.nn.Module, path: str | Path | None,
                 state: dict[str, torch.Tensor] | None = None) -> WeightHandle:
        """A handle on ``state`` (default: :func:`published_weights`), or on an HF folder written at ``path``."""
        depth = None if self.depth_stats is None else self.depth_stats.published()
        adapter = adapter_settings(model)
        if path is None:
            state = published_weights(model) if state is None else state
            return WeightHandle(version=self.version, state_dict=state, depth_disagreement=depth, adapter=adapter)
        with atomic_dir(path) as tmp:
            save_weights(model, tmp)
        return WeightHandle(version=self.version, path=str(path), depth_disagreement=depth, adapter=adapter)

    def _save(self, path: str | Path, model: torch.nn.Module, state_text: str,
              save_optimizer: Callable[[Path], None]) -> Path:
        """Write a checkpoint folder atomically: weights, tokenizer, ``save_optimizer(folder)``, ``state.json``."""
        with atomic_dir(path, manifest=True) as tmp:
            save_weights(model, tmp)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(tmp)
            save_optimizer(tmp)
            (tmp / STATE_FILE).write_text(state_text)
        return Path(path)
