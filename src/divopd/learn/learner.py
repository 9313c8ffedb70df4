"""The learner: exactly one optimizer update per composed batch (paper, "Asynchronous multi-turn OPD"); θ_old is the
learner before the update, so by default (``old_logprobs="same-pass"``) the gradient pass's detached log probabilities
are its recomputation (r = 1). The model stays in eval mode (docs/concepts/learner.md).
"""

from __future__ import annotations

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
    WeightHandle,
    checkpoint_state_text,
    load_dcp_optimizer,
    read_state,
    restore_learner_state,
)
from divopd.learn.inputs import UpdateInputs, batch_inputs, batch_row_weights, micro_batches, pad_token_id
from divopd.learn.lora import is_adapter_folder, load_adapter_model
from divopd.learn.manifest import SHARDED_FORMAT
from divopd.learn.settings import LearnerConfig
from divopd.learn.update import (
    Accumulated,
    ForwardPass,
    LearnerCounters,
    MicroBatchOutput,
    batch_loss,
    forward_pass,
    whole_batch_metrics,
)
from divopd.models import load_model, resolve_dtype
from divopd.sampling.sampler import Batch

__all__ = ["CHECKPOINT_FORMAT", "Learner", "LearnerConfig", "WeightHandle"]

#: ``state.json`` ``format`` of a single-process checkpoint (a sharded one's is :data:`SHARDED_FORMAT`).
CHECKPOINT_FORMAT = 1


class Learner(LearnerCounters):
    """The single-process learner (:class:`~divopd.learn.protocol.LearnerProtocol`) of ``model`` (any causal LM, moved
    to ``config.device``/``config.dtype``); ``tokenizer`` (optional) gives the pad id and is saved with checkpoints."""

    def __init__(self, model: torch.nn.Module, config: LearnerConfig, tokenizer: Any = None) -> None:
        self._start(config)
        self.device = torch.device(config.device)
        self.model = model.to(device=self.device, dtype=resolve_dtype(config.dtype)).eval()
        self.tokenizer = tokenizer
        self.pad_id = pad_token_id(model, tokenizer)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay,
        )

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        """One process: no ranks to report."""
        return []

    def close(self) -> None:
        """Nothing to release (the :class:`~divopd.learn.protocol.LearnerProtocol` method ranks need)."""

    def _forward(self, inputs: UpdateInputs, idx: np.ndarray, *, with_topk: bool) -> ForwardPass:
        return forward_pass(self.model, inputs, idx, layout=self.config.packing, pad_id=self.pad_id,
                            device=self.device, with_topk=with_topk)

    def step(self, batch: Batch | Sequence[Turn]) -> dict[str, float]:
        """One update on ``batch`` (a :class:`divopd.sampling.Batch` or a sequence of turns); returns ``learner/*``
        metrics. Exactly one optimizer step (skipped, and counted, only if the gradient is not finite)."""
        cfg = self.config
        t0 = time.perf_counter()
        turns, inputs = batch_inputs(batch, cfg, self.model.get_input_embeddings().num_embeddings)
        weights, alpha = batch_row_weights(batch, inputs, cfg, self.version)
        groups = micro_batches(inputs, cfg.micro_batch_tokens)
        self.optimizer.zero_grad(set_to_none=True)
        acc = self.accumulate(inputs, groups, weights)
        metrics = acc.metrics
        if len(groups) > 1:  # the whole batch's metrics, from the micro-batches' outputs
            metrics = whole_batch_metrics(cfg, inputs, acc.outputs, weights, self.device)
        t2 = time.perf_counter()
        grad_norm, skipped = self._optimizer_step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t3 = time.perf_counter()
        return self._record(turns, t3 - t0, loss=metrics, grad_norm=grad_norm, skipped=skipped, tokens=acc.tokens,
                            input_slots=acc.input_slots, truncated_prompts=inputs.truncated_prompts,
                            lr=float(self.optimizer.param_groups[0]["lr"]), time_forward_backward_s=acc.t_fb,
                            time_optimizer_s=t3 - t2, row_weights=weights, alpha=alpha)

    def accumulate(self, inputs: UpdateInputs, groups: list[np.ndarray], weights: np.ndarray | None, *,
                   n_rows: int | None = None, total_valid: int | None = None, scale: float = 1.0,
                   weighted: bool | None = None) -> Accumulated:
        """Forward and backward passes of every micro-batch (``groups``: row indices into ``inputs``). ``n_rows`` /
        ``total_valid``: the loss denominators (default: those of ``inputs``; a rank passes the whole batch's);
        ``weighted``: scale each group's loss by its share (default: with several groups); ``scale`` multiplies every
        loss. An empty group runs a zero-loss pass, so that every rank joins the same collectives."""
        cfg = self.config
        n = len(inputs) if n_rows is None else n_rows
        total = max(int(inputs.mask.sum()), 1) if total_valid is None else max(total_valid, 1)
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
                    old, _, _, _, _ = self._forward(inputs, idx, with_topk=False)
            lp, top, scored, tok, slots = self._forward(inputs, idx, with_topk=with_topk)
            if cfg.old_logprobs == "same-pass":
                old = lp.detach()
            acc.tokens += tok
            acc.input_slots += slots
            loss, acc.metrics = batch_loss(cfg, inputs, idx, lp, old, top, scored, weights, self.device)
            if weighted:
                weight = (len(idx) / max(n, 1)) if cfg.reduction != "token-mean" else \
                    float(inputs.mask[idx].sum()) / total
                (loss * (weight * scale)).backward()
            elif scale != 1.0:
                (loss * scale).backward()
            else:
                loss.backward()
            acc.outputs.append(MicroBatchOutput(idx, lp.detach(), old, None if top is None else top.detach(), scored))
            acc.t_fb += time.perf_counter() - t1
        return acc

    def _empty_pass(self) -> None:
        """A forward and backward pass with zero loss (a rank without rows still joins the collectives)."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
        (self.model(input_ids=ids).logits.sum() * 0.0).backward()

    def _grad_norm(self) -> torch.Tensor:
        """The global L2 norm of the gradients."""
        return torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None], 2.0)

    def _optimizer_step(self) -> tuple[float, bool]:
        """Clip and step (skipped, counted, on a non-finite norm), zero grads, ``version += 1``; (norm, skipped)."""
        cfg = self.config
        norm = self._grad_norm()
        grad_norm = float(norm)
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.skipped_updates += 1
        else:
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grads_with_norm_(self.params, cfg.grad_clip, norm)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        return grad_norm, skipped

    # ------------------------------------------------------------------ publication and checkpoints
    def publish(self, path: str | Path | None = None) -> WeightHandle:
        """A snapshot for explorers: a CPU ``state_dict`` copy, or an HF folder written atomically at ``path``."""
        return self._publish(self.model, path)

    def save_checkpoint(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """HF model, tokenizer, ``optimizer.pt``, ``state.json`` and ``manifest.json``, written atomically."""
        text = checkpoint_state_text(self, CHECKPOINT_FORMAT, extra_state)
        return self._save(path, self.model, text,
                          lambda tmp: torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE))

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: LearnerConfig | None = None) -> tuple[Learner, dict[str, Any]]:
        """Resume from a checkpoint (``config``: default the saved one); ``(learner, extra_state)``. The next ``step``
        on the same batch reproduces an uninterrupted run's update bit for bit on CPU."""
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

