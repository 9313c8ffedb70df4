"""The learner: exactly one optimizer update per composed batch (paper, "Asynchronous multi-turn OPD").

``Learner.step(batch)`` reads top to bottom:

1. rows: each turn's prompt (left-truncated to ``max_prompt_len`` unless the explorer already flagged it truncated)
   and response, its effective mask (action ∧ teacher-valid ∧ finite teacher logprob) and teacher log probabilities;
2. pack the rows into model inputs (``packed``: padding-free, or ``padded``);
3. one forward pass with gradients → log π_θ of every response token (only response positions get logits);
4. θ_old = the learner snapshot immediately before the update, recomputed on the queued tokens. With one update per
   batch θ_old = θ at gradient evaluation, so by default (``old_logprobs="same-pass"``) the detached values of step 3
   *are* the recomputation (r = 1 exactly); ``"recompute"`` runs a separate no-grad pass (same numbers, ~30% slower);
5. :func:`~divopd.learn.loss.opd_loss` (or the top-k estimator), backward, clipping, one AdamW step, ``version += 1``.
   Rows carry unit weights (the paper) unless the batch has ``row_weights`` (``divopd-focus``'s task balance) or
   ``turn_balance_updates`` is set (TurnOPD's token-to-turn schedule, :mod:`divopd.learn.turnopd`); unit weights take
   the unweighted code path, so the paper's loss is computed exactly as without the feature.

The model is kept in eval mode (dropout off), so steps 3 and 4 see the same function. Counters for the paper's
efficiency figures: ``tokens_total`` (prompt + response tokens processed) and ``compute_s_total`` (wall seconds inside
``step``, the CPU stand-in for trainer GPU-hours). The settings are :mod:`divopd.learn.settings` (importable from here).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from divopd.experience.turn import Turn
from divopd.learn.checkpoint import (
    DCP_DIR,
    OPTIMIZER_FILE,
    STATE_FILE,
    WeightHandle,
    atomic_dir,
    decode_rng_state,
    encode_rng_state,
    load_dcp_optimizer,
    read_state,
    to_json_safe,
)
from divopd.learn.lora import adapter_settings, is_adapter_folder, load_adapter_model, published_weights, save_weights
from divopd.learn.manifest import SHARDED_FORMAT as _SHARDED_FORMAT
from divopd.learn.rows import Rows, _micro_batches, prepare_rows
from divopd.learn.settings import LearnerConfig
from divopd.learn.turnopd import DepthStats, turn_balance_alpha, turn_balance_weights
from divopd.learn.update import Accumulated, UpdateStats, batch_loss
from divopd.models import load_model, resolve_dtype
from divopd.models.packing import gather_logprobs, pack_sequences, scatter_rows, selected_logits
from divopd.sampling.sampler import Batch

__all__ = ["Learner", "LearnerConfig", "Rows", "WeightHandle", "batch_row_weights", "batch_rows", "prepare_rows",
           "restore_learner_state"]

CHECKPOINT_FORMAT = 1
#: :mod:`divopd.learn.sharded`'s checkpoints: model and optimizer shards in ``dcp/`` (torch.distributed.checkpoint)
SHARDED_FORMAT = _SHARDED_FORMAT


def batch_rows(batch: Batch | Sequence[Turn] | None, config: LearnerConfig, vocab: int) -> tuple[list[Turn], Rows]:
    """A batch's turns and their rows (:func:`~divopd.learn.rows.prepare_rows` with the learner's settings), every
    token id checked against a vocabulary of ``vocab`` ids; the single-process and the sharded learner's step 1."""
    if batch is None:
        raise ValueError("Learner.step: batch is None (the sampler was not ready; call next_batch again later)")
    turns = list(getattr(batch, "turns", batch))
    if not turns:
        raise ValueError("Learner.step: empty batch (the sampler returns None, not an empty batch, when not ready)")
    rows = prepare_rows(turns, max_prompt_len=config.max_prompt_len,
                        topk=config.topk if config.estimator == "topk" else None)
    for t, p, r in zip(turns, rows.prompts, rows.responses, strict=True):
        for name, ids in (("prompt_ids", p), ("response_ids", r)):
            if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
                raise ValueError(f"Learner.step: turn {t.key} has {name} outside the model's vocabulary "
                                 f"[0, {vocab}) (min {ids.min()}, max {ids.max()}): tokenizer/model mismatch?")
    return turns, rows


def batch_row_weights(batch: Batch | Sequence[Turn], rows: Rows, config: LearnerConfig, version: int
                      ) -> tuple[np.ndarray | None, float | None]:
    """An update's per-row loss weights and TurnOPD's α: ``Batch.row_weights`` (``divopd-focus``) times TurnOPD's
    schedule at learner ``version`` (``turn_balance_updates``); ``(None, None)`` = unit weights (the paper's loss)."""
    n = len(rows.prompts)
    given = getattr(batch, "row_weights", None)
    weights = None
    if given is not None:
        weights = np.asarray(given, dtype=np.float64)
        if weights.shape != (n,) or not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"Learner.step: Batch.row_weights must be {n} finite weights >= 0")
    alpha = None
    if config.turn_balance_updates is not None:
        alpha = turn_balance_alpha(version, config.turn_balance_updates)
        balance = turn_balance_weights(rows.mask.sum(axis=1), alpha)
        weights = balance if weights is None else weights * balance
    return weights, alpha


class Learner:
    """One optimizer update per batch of turns; versioned weights; atomic checkpoints.

    Args:
        model: any causal LM (e.g. from :func:`divopd.models.load_model`); moved to ``config.device``/``config.dtype``.
        config: :class:`LearnerConfig`.
        tokenizer: optional; its pad id is used for padding and it is saved with checkpoints.
    """

    def __init__(self, model: torch.nn.Module, config: LearnerConfig, tokenizer: Any = None) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        self.device = torch.device(config.device)
        self.model = model.to(device=self.device, dtype=resolve_dtype(config.dtype)).eval()
        self.tokenizer = tokenizer
        self.pad_id = self._pad_id(model, tokenizer)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay,
        )
        self.version = 0
        self.tokens_total = 0
        self.compute_s_total = 0.0
        self.skipped_updates = 0
        self.depth_stats = DepthStats() if config.depth_stats else None
        self.failed: str | None = None  # one process: it fails by raising, never half-way
        self.last_update: UpdateStats | None = None  # what the newest update reported

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        """One process: no ranks to report."""
        return []

    def close(self) -> None:
        """Nothing to release (the :class:`~divopd.learn.protocol.LearnerProtocol` method ranks need)."""

    @staticmethod
    def _pad_id(model: torch.nn.Module, tokenizer: Any) -> int:
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        return int(pad) if pad is not None else 0

    # ------------------------------------------------------------------ forward helpers
    def _forward(self, rows: Rows, idx: np.ndarray, *, with_topk: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, int, int]:
        """log π of the response tokens of rows ``idx`` ([n, L]), the student's log probs at the teacher top-k ids
        ([n, L, k] or None), the scored mask [n, L], tokens processed and input slots."""
        packed = pack_sequences([rows.prompts[i] for i in idx], [rows.responses[i] for i in idx],
                                layout=self.config.packing, pad_id=self.pad_id).to(self.device)
        logits = selected_logits(self.model, packed)  # [K, V]
        lp = scatter_rows(gather_logprobs(logits, packed.targets), packed)  # [n, Lb]
        L = rows.mask.shape[1]
        lp = torch.nn.functional.pad(lp, (0, L - lp.shape[1]))
        scored = torch.nn.functional.pad(packed.scored, (0, L - packed.scored.shape[1]))
        top = None
        if with_topk:
            ids = torch.from_numpy(rows.topk_ids[idx]).to(self.device)  # [n, L, k]
            ids_K = ids[packed.seq_index, packed.token_index]  # [K, k]
            top = scatter_rows(gather_logprobs(logits, ids_K), packed, fill=float("nan"))
            top = torch.nn.functional.pad(top, (0, 0, 0, L - top.shape[1]), value=float("nan"))
        return lp, top, scored, packed.tokens, packed.input_tokens

    def _loss(self, rows: Rows, idx: np.ndarray, lp: torch.Tensor, old: torch.Tensor, top: torch.Tensor | None,
              scored: torch.Tensor, weights: np.ndarray | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        return batch_loss(self.config, rows, idx, lp, old, top, scored, weights, self.device)

    def row_weights(self, batch: Batch | Sequence[Turn], rows: Rows) -> tuple[np.ndarray | None, float | None]:
        """This update's per-row loss weights and TurnOPD's α (:func:`batch_row_weights` at this version)."""
        return batch_row_weights(batch, rows, self.config, self.version)

    # ------------------------------------------------------------------ the update
    def rows_of(self, batch: Batch | Sequence[Turn]) -> tuple[list[Turn], Rows]:
        """Step 1: the batch's turns and their rows (checked against the model's vocabulary)."""
        return batch_rows(batch, self.config, self.model.get_input_embeddings().num_embeddings)

    def step(self, batch: Batch | Sequence[Turn]) -> dict[str, float]:
        """One update on ``batch`` (a :class:`divopd.sampling.Batch` or a sequence of turns); returns ``learner/*``
        metrics. Exactly one optimizer step (skipped, and counted, only if the gradient is not finite)."""
        cfg = self.config
        t0 = time.perf_counter()
        turns, rows = self.rows_of(batch)
        weights, alpha = self.row_weights(batch, rows)
        groups = _micro_batches(rows, cfg.micro_batch_tokens)
        self.optimizer.zero_grad(set_to_none=True)
        acc = self.accumulate(rows, groups, weights)
        metrics = acc.metrics
        if len(groups) > 1:  # metrics of the whole batch, from the detached pieces
            metrics = self._whole_batch_metrics(rows, groups, acc.parts, cfg.estimator == "topk", weights)
        t2 = time.perf_counter()
        grad_norm, skipped = self._optimizer_step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t3 = time.perf_counter()
        compute_s = t3 - t0
        self.tokens_total += acc.tokens
        self.compute_s_total += compute_s
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.last_update = UpdateStats(
            loss=metrics, grad_norm=grad_norm, skipped=skipped, tokens=acc.tokens, tokens_total=self.tokens_total,
            input_slots=acc.input_slots, compute_s=compute_s, compute_s_total=self.compute_s_total,
            version=self.version, truncated_prompts=rows.truncated_prompts, lr=lr, time_forward_backward_s=acc.t_fb,
            time_optimizer_s=t3 - t2, row_weights=weights, alpha=alpha)
        if self.depth_stats is not None:
            self.depth_stats.update(turns)
        return self.last_update.metrics()

    def accumulate(self, rows: Rows, groups: list[np.ndarray], weights: np.ndarray | None, *,
                   n_rows: int | None = None, total_valid: int | None = None, scale: float = 1.0,
                   weighted: bool | None = None) -> Accumulated:
        """Steps 2-4 and the backward pass of every micro-batch (``groups``: row indices into ``rows``).

        ``n_rows`` / ``total_valid``: the whole batch's row and valid-token counts, the loss denominators (default:
        those of ``rows``; a learner rank holding part of the batch passes the global ones). ``weighted``: scale each
        group's loss by its share of the batch (default: when there is more than one group); ``scale`` multiplies
        every loss (a sharded rank undoes the gradient average over ranks with it). An empty group runs a zero-loss
        pass, so every rank of a sharded learner takes part in the same number of collectives."""
        cfg = self.config
        n = len(rows.prompts) if n_rows is None else n_rows
        total = max(int(rows.mask.sum()), 1) if total_valid is None else max(total_valid, 1)
        weighted = len(groups) > 1 if weighted is None else weighted
        with_topk = cfg.estimator == "topk"
        acc = Accumulated()
        for idx in groups:
            t1 = time.perf_counter()
            if len(idx) == 0:
                self._empty_pass()
                acc.t_fb += time.perf_counter() - t1
                continue
            if cfg.old_logprobs == "recompute":
                with torch.no_grad():
                    old, _, _, _, _ = self._forward(rows, idx, with_topk=False)
            lp, top, scored, tok, slots = self._forward(rows, idx, with_topk=with_topk)
            if cfg.old_logprobs == "same-pass":
                old = lp.detach()
            acc.tokens += tok
            acc.input_slots += slots
            loss, acc.metrics = self._loss(rows, idx, lp, old, top, scored, weights)
            if weighted:
                weight = (len(idx) / max(n, 1)) if cfg.reduction != "token-mean" else \
                    float(rows.mask[idx].sum()) / total
                (loss * (weight * scale)).backward()
            elif scale != 1.0:
                (loss * scale).backward()
            else:
                loss.backward()
            acc.parts.append((idx, lp.detach(), old, None if top is None else top.detach(), scored))
            acc.t_fb += time.perf_counter() - t1
        return acc

    def _empty_pass(self) -> None:
        """A forward and backward pass with zero loss (a rank without rows still joins the collectives)."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
        (self.model(input_ids=ids).logits.sum() * 0.0).backward()

    def _whole_batch_metrics(self, rows: Rows, groups: list[np.ndarray], parts: list[tuple],
                             with_topk: bool, weights: np.ndarray | None = None) -> dict[str, Any]:
        """Loss metrics of the whole batch from the micro-batches' detached pieces, back in row order."""
        order = np.argsort(np.concatenate(groups))
        lp_all = torch.cat([p[1] for p in parts])[order]
        old_all = torch.cat([p[2] for p in parts])[order]
        top_all = None if not with_topk else torch.cat([p[3] for p in parts])[order]
        sc_all = torch.cat([p[4] for p in parts])[order]
        with torch.no_grad():
            _, metrics = self._loss(rows, np.arange(len(rows.prompts)), lp_all, old_all, top_all, sc_all, weights)
        return metrics

    def _optimizer_step(self) -> tuple[float, bool]:
        """Clip the gradient and take the AdamW step (skipped, and counted, when the norm is not finite); zero the
        gradients; ``version += 1``. Returns (gradient norm, skipped)."""
        cfg = self.config
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_updates += 1
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        return grad_norm, skipped

    @torch.no_grad()
    def evaluate(self, batch: Any) -> dict[str, float]:
        """The loss metrics of ``batch`` under the current weights, without updating (``learner/*`` names)."""
        cfg = self.config
        turns = list(getattr(batch, "turns", batch))
        rows = prepare_rows(turns, max_prompt_len=cfg.max_prompt_len,
                            topk=cfg.topk if cfg.estimator == "topk" else None)
        idx = np.arange(len(turns))
        lp, top, scored, _, _ = self._forward(rows, idx, with_topk=cfg.estimator == "topk")
        _, metrics = self._loss(rows, idx, lp, lp, top, scored)
        return {f"learner/{k}": float(v) for k, v in metrics.items()}

    # ------------------------------------------------------------------ publication and checkpoints
    def publish(self, path: str | Path | None = None) -> WeightHandle:
        """A versioned snapshot for explorers: a CPU ``state_dict`` copy, or (``path`` given) an HF folder written
        atomically, which explorers load with ``handle.load_into(model)``."""
        depth = None if self.depth_stats is None else self.depth_stats.published()
        if path is None:
            return WeightHandle(version=self.version, state_dict=published_weights(self.model),
                                depth_disagreement=depth, adapter=adapter_settings(self.model))
        with atomic_dir(path) as tmp:
            save_weights(self.model, tmp)
        return WeightHandle(version=self.version, path=str(path), depth_disagreement=depth,
                            adapter=adapter_settings(self.model))

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": self.version,
            "tokens_total": self.tokens_total,
            "compute_s_total": self.compute_s_total,
            "skipped_updates": self.skipped_updates,
        }
        if self.depth_stats is not None:
            state["depth_disagreement"] = list(self.depth_stats.published())
        return state

    def save_checkpoint(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """Write model (HF safetensors) + tokenizer + ``optimizer.pt`` + ``state.json`` (version, counters, config,
        torch RNG, ``extra_state`` as JSON) + ``manifest.json`` (sizes, hashes) atomically to ``path``. Returns
        ``path``."""
        state = {
            "format": CHECKPOINT_FORMAT,
            "learner": self.state(),
            "config": self.config.model_dump(mode="json"),
            "rng": {"torch": encode_rng_state(torch.get_rng_state())},
            "extra_state": to_json_safe(extra_state or {}),
        }
        text = json.dumps(state, allow_nan=True)
        with atomic_dir(path, manifest=True) as tmp:
            save_weights(self.model, tmp)  # a LoRA student: its adapter only (divopd.learn.lora)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(tmp)
            torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            (tmp / STATE_FILE).write_text(text)
        return Path(path)

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: LearnerConfig | None = None) -> tuple[Learner, dict[str, Any]]:
        """Resume from :meth:`save_checkpoint`: model, tokenizer (if saved), optimizer, version, counters and RNG.

        ``config`` defaults to the saved one. Returns ``(learner, extra_state)``; the next ``step`` on the same batch
        reproduces an uninterrupted run's update bit for bit on CPU.
        """
        state = read_state(path)
        if state.get("format") not in (CHECKPOINT_FORMAT, SHARDED_FORMAT):
            raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, expected {CHECKPOINT_FORMAT} or "
                             f"{SHARDED_FORMAT} (sharded)")
        if config is None:
            config = LearnerConfig(**state["config"])
        if is_adapter_folder(path):  # a LoRA student: the base model with the checkpoint's adapter
            model, tokenizer = load_adapter_model(path, dtype=config.dtype, device=config.device)
        elif (Path(path) / "tokenizer_config.json").is_file():
            model, tokenizer = load_model(str(path), dtype=config.dtype, device=config.device)
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(config.dtype))
            tokenizer = None
        learner = cls(model, config, tokenizer)
        if state["format"] == SHARDED_FORMAT:  # written by N ranks (divopd.learn.sharded): read its DCP shards
            load_dcp_optimizer(learner.model, learner.optimizer, Path(path) / DCP_DIR)
        else:
            opt_state = torch.load(Path(path) / OPTIMIZER_FILE, map_location=learner.device, weights_only=True)
            learner.optimizer.load_state_dict(opt_state)
        return learner, restore_learner_state(learner, state)


def restore_learner_state(learner: Any, state: dict[str, Any]) -> dict[str, Any]:
    """The counterpart of ``state()`` on resume, for both learners (this one and ``ShardedLearner``): set the version,
    the counters and the depth statistics from a checkpoint's ``state.json`` contents and restore the torch RNG.
    Returns the checkpoint's ``extra_state``."""
    saved = state["learner"]
    learner.version = int(saved["version"])
    learner.tokens_total = int(saved["tokens_total"])
    learner.compute_s_total = float(saved["compute_s_total"])
    learner.skipped_updates = int(saved.get("skipped_updates", 0))
    if learner.depth_stats is not None:
        learner.depth_stats = DepthStats(saved.get("depth_disagreement", ()))
    torch.set_rng_state(decode_rng_state(state["rng"]["torch"]))
    return state.get("extra_state", {})
