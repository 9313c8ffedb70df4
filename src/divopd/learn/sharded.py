"""The sharded learner (``learner.world_size > 1``): the learner's interface in the driver, N FSDP2 ranks
(:mod:`divopd.learn.dist_worker`) doing the work, each on a contiguous part of the batch with the batch's global
denominators, so their summed gradients are the single-process gradient (docs/concepts/distributed.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from divopd.learn.checkpoint import (
    DCP_DIR,
    OPTIMIZER_FILE,
    WeightHandle,
    checkpoint_state_text,
    is_tied,
    read_state,
    restore_learner_state,
)
from divopd.learn.inputs import batch_inputs, batch_row_weights, micro_batches, pad_token_id
from divopd.learn.learner import Learner
from divopd.learn.lora import LoraSettings, adapter_settings, has_adapter, load_student, published_weights
from divopd.learn.manifest import SHARDED_FORMAT
from divopd.learn.protocol import LearnerProtocol
from divopd.learn.ranks import LearnerRankError, ProcessRanks, Ranks
from divopd.learn.settings import LearnerConfig
from divopd.learn.update import LearnerCounters, RankStep, whole_batch_metrics

__all__ = ["LearnerRankError", "ShardedLearner", "build_learner", "learner_from_checkpoint", "process_ranks",
           "split_rows"]

RanksFactory = Callable[[int, dict[str, Any]], Ranks]


def split_rows(n: int, world_size: int) -> list[np.ndarray]:
    """Row indices of each rank: N contiguous, near-equal parts (the first ``n % world_size`` one row longer)."""
    return [np.asarray(part, dtype=np.int64) for part in np.array_split(np.arange(n), world_size)]


class ShardedLearner(LearnerCounters):
    """The learner over ``config.world_size`` FSDP2 ranks; same methods and counters as :class:`Learner`. ``source``:
    the HF model (or LoRA adapter) folder every rank and the driver's CPU copy load; ``lora``: fresh adapters on it;
    ``ranks`` builds the ranks from ``(world_size, setup kwargs)`` (default :class:`ProcessRanks`)."""

    def __init__(self, source: str, config: LearnerConfig, ranks: RanksFactory | None = None,
                 lora: LoraSettings | None = None) -> None:
        self._start(config)
        lora = lora if lora is not None and lora.enabled else None
        model, self.tokenizer = load_student(source, dtype=config.dtype, device="cpu", lora=lora, seed=config.seed)
        self._model = model.eval()
        self._vocab = model.get_input_embeddings().num_embeddings
        self.pad_id = pad_token_id(model, self.tokenizer)
        self.last_publish_s = 0.0
        self.last_step: list[RankStep] = []  # every rank's reply to the newest update
        self._model_version = 0
        setup = {"source": str(source), "config": config.model_dump(mode="json"), "threads": torch.get_num_threads(),
                 "deterministic": torch.are_deterministic_algorithms_enabled(),
                 "lora": None if lora is None else lora.model_dump(mode="json")}
        self.ranks = (ranks or ProcessRanks)(config.world_size, setup)

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        """What each rank reported at setup (rank, pid, node, device, backend; the Ray runtime adds its node id)."""
        return list(self.ranks.info)

    @property
    def model(self) -> torch.nn.Module:
        """The driver's full CPU copy of the model, with the current weights (gathered when stale)."""
        if self._model_version != self.version:
            self._gather()
        return self._model

    def _call(self, method: str, args: list[tuple[Any, ...]] | None = None) -> list[Any]:
        if self.failed is not None:
            raise LearnerRankError(self.failed)
        try:
            return self.ranks.call(method, args if args is not None else [()] * self.world_size)
        except LearnerRankError as exc:
            self.failed = f"{exc} at learner version {self.version}"
            raise LearnerRankError(self.failed) from None

    # ------------------------------------------------------------------ the update
    def step(self, batch: Any) -> dict[str, float]:
        """One update on ``batch`` over every rank; returns the single-process learner's ``learner/*`` metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        turns, inputs = batch_inputs(batch, cfg, self._vocab)
        n = len(turns)
        weights, alpha = batch_row_weights(batch, inputs, cfg, self.version)
        parts_idx = split_rows(n, self.world_size)
        subsets = [inputs.take(idx) for idx in parts_idx]
        groups = [micro_batches(sub, cfg.micro_batch_tokens) if len(sub) else [] for sub in subsets]
        depth = max(len(g) for g in groups)
        groups = [g + [np.zeros(0, dtype=np.int64)] * (depth - len(g)) for g in groups]
        total_valid = int(inputs.mask.sum())
        args = [(sub, g, n, total_valid, None if weights is None else weights[idx])
                for sub, g, idx in zip(subsets, groups, parts_idx, strict=True)]
        replies: list[RankStep] = self._call("step", args)
        outputs = [replace(out, idx=idx[out.idx]) for idx, reply in zip(parts_idx, replies, strict=True)
                   for out in reply.outputs]  # row indices into the whole batch
        metrics = whole_batch_metrics(cfg, inputs, outputs, weights, torch.device("cpu"))
        self.version += 1
        self.skipped_updates += int(replies[0].skipped)
        self.last_step = replies
        return self._record(turns, time.perf_counter() - t0, loss=metrics, grad_norm=replies[0].grad_norm,
                            skipped=replies[0].skipped, tokens=sum(r.tokens for r in replies),
                            input_slots=sum(r.input_slots for r in replies), truncated_prompts=inputs.truncated_prompts,
                            lr=cfg.lr, time_forward_backward_s=max(r.t_fb for r in replies),
                            time_optimizer_s=max(r.t_opt for r in replies), row_weights=weights, alpha=alpha)

    # ------------------------------------------------------------------ publication and checkpoints
    def _gather(self) -> dict[str, torch.Tensor]:
        state = self._call("full_state_dict")[0]
        if has_adapter(self._model):  # the adapter's tensors only: the frozen base is the driver's own already
            _, unexpected = self._model.load_state_dict(state, strict=False)
            trained = {k for k, p in self._model.named_parameters() if p.requires_grad}
            if unexpected or set(state) != trained:
                raise LearnerRankError(f"the ranks' adapter does not fit the driver's (unexpected {unexpected[:3]}, "
                                       f"missing {sorted(trained - set(state))[:3]})")
        else:
            own = self._model.state_dict()
            for key in own:
                if key not in state and is_tied(self._model, key):
                    state[key] = state[next(k for k in own if own[k] is own[key] and k in state)]
            self._model.load_state_dict(state, strict=True)
        self._model_version = self.version
        return state

    def publish(self, path: str | Path | None = None) -> WeightHandle:
        """Rank 0 gathers the weights (a LoRA student's adapter) into the driver's CPU model once per version
        (``last_publish_s``: its seconds); an in-memory handle, or (``path``) an HF (adapter) folder."""
        t0 = time.perf_counter()
        state = self._gather()
        if adapter_settings(self._model) is not None:  # the published names and copies of the one-process LoRA learner
            state = published_weights(self._model)
        self.last_publish_s = time.perf_counter() - t0
        return self._publish(self._model, path, state)

    def save_checkpoint(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """HF (adapter) folder, tokenizer, ``dcp/`` (shards, resharded on resume), ``state.json``, atomically."""
        text = checkpoint_state_text(self, SHARDED_FORMAT, extra_state, world_size=self.world_size)
        return self._save(path, self.model, text,
                          lambda tmp: self._call("save", [(str(tmp / DCP_DIR),)] * self.world_size))

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: LearnerConfig | None = None,
                        ranks: RanksFactory | None = None) -> tuple[ShardedLearner, dict[str, Any]]:
        """Resume from a sharded (any N, resharded) or a single-process checkpoint, LoRA or not, on every rank."""
        state = read_state(path)
        config = config if config is not None else LearnerConfig(**state["config"])
        if state.get("format") == SHARDED_FORMAT:  # refuse a planted index in one line, before any rank starts
            from divopd.learn.safe_dcp import read_metadata

            read_metadata(Path(path) / DCP_DIR)
        learner = cls(str(path), config, ranks)
        if state.get("format") == SHARDED_FORMAT:
            learner._call("load", [(str(Path(path) / DCP_DIR),)] * learner.world_size)
        else:
            learner._call("load_full_optimizer", [(str(Path(path) / OPTIMIZER_FILE),)] * learner.world_size)
        extra = restore_learner_state(learner, state)
        learner._model_version = learner.version
        learner._call("set_state", [(learner.version,)] * learner.world_size)
        return learner, extra

    def close(self) -> None:
        """End the ranks (idempotent)."""
        self.ranks.close()


def process_ranks(collective_timeout_s: float, call_timeout_s: float | None = None) -> RanksFactory:
    """The factory of :class:`ProcessRanks` whose collectives fail after ``collective_timeout_s`` without a peer
    (``runtime.collective_timeout_s``) and whose calls fail when no rank answers within ``call_timeout_s``
    (``runtime.rank_call_timeout_s``): then the driver ends them all (:class:`LearnerRankError`)."""

    def make(world_size: int, setup: dict[str, Any]) -> Ranks:
        return ProcessRanks(world_size, {**setup, "collective_timeout_s": float(collective_timeout_s)},
                            call_timeout_s=call_timeout_s)

    return make


def build_learner(path: str, config: LearnerConfig, ranks: RanksFactory | None = None,
                  lora: LoraSettings | None = None) -> LearnerProtocol:
    """A fresh learner (one process, or sharded) on the HF model at ``path``; ``lora`` (rank > 0): a LoRA student."""
    if config.world_size > 1:
        return ShardedLearner(path, config, ranks, lora=lora)
    model, tokenizer = load_student(path, dtype=config.dtype, device=config.device, lora=lora, seed=config.seed)
    return Learner(model, config, tokenizer)


def learner_from_checkpoint(path: str | Path, config: LearnerConfig, ranks: RanksFactory | None = None
                            ) -> tuple[LearnerProtocol, dict[str, Any]]:
    """Resume any checkpoint (single-process or sharded, any N; LoRA or not) with ``config.world_size`` ranks."""
    if config.world_size > 1:
        return ShardedLearner.from_checkpoint(path, config, ranks)
    return Learner.from_checkpoint(path, config)

