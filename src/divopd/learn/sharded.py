"""The sharded learner (``learner.world_size > 1``): the :class:`~divopd.learn.learner.Learner`'s interface in the
driver, N FSDP2 ranks (:mod:`divopd.learn.dist_worker`) doing the work.

One update: the driver prepares the batch's rows exactly as the single-process learner does, splits them into N
contiguous parts (one per rank; a rank without rows runs a zero-loss pass so that every rank joins the same
collectives), and sends each rank its part with the batch's global denominators (N rows, dead rows included; the
batch's valid tokens for ``token-mean``). The ranks' summed gradients are the single-process gradient; the global
gradient norm is clipped and AdamW steps every shard. The ranks send back their detached log probabilities, from
which the driver computes the ``learner/*`` metrics of the whole batch with the same code as the single-process
learner, so ``learner/loss`` and the weights agree with ``world_size: 1`` to float rounding.

Publication: rank 0 gathers ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
cpu_offload=True))`` once per version; the driver keeps it in its own CPU copy of the model (for evaluation and the
Appendix-E diagnostics) and hands it to the explorers as a :class:`~divopd.learn.checkpoint.WeightHandle`
(``last_publish_s`` is the gather's wall time, logged as ``time/publish_s``).

Checkpoints (format 2): the HF model folder and tokenizer (from the gathered weights, so ``divopd eval`` and every
export path read it as before), ``state.json``, and ``dcp/`` — model and optimizer shards written with
``torch.distributed.checkpoint``; resuming reshards them to any number of ranks, and the single-process learner
reads them too (:func:`divopd.learn.checkpoint.load_dcp_optimizer`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from divopd.learn.checkpoint import (
    DCP_DIR,
    OPTIMIZER_FILE,
    WeightHandle,
    _is_tied,
    atomic_dir,
    encode_rng_state,
    read_state,
    to_json_safe,
)
from divopd.learn.learner import SHARDED_FORMAT, Learner, batch_row_weights, batch_rows, restore_learner_state
from divopd.learn.lora import LoraSettings, add_adapter, check_lora, is_adapter_folder
from divopd.learn.protocol import LearnerProtocol
from divopd.learn.ranks import LearnerRankError, ProcessRanks, Ranks
from divopd.learn.rows import Rows, _micro_batches
from divopd.learn.settings import LearnerConfig
from divopd.learn.turnopd import DepthStats
from divopd.learn.update import RankStep, UpdateStats, batch_loss
from divopd.models import load_model

__all__ = ["LearnerRankError", "ShardedLearner", "build_learner", "learner_from_checkpoint", "process_ranks",
           "split_rows"]

RanksFactory = Callable[[int, dict[str, Any]], Ranks]


def split_rows(n: int, world_size: int) -> list[np.ndarray]:
    """Row indices of each rank: N contiguous, near-equal parts (the first ``n % world_size`` one row longer)."""
    return [np.asarray(part, dtype=np.int64) for part in np.array_split(np.arange(n), world_size)]


def subset_rows(rows: Rows, idx: np.ndarray) -> Rows:
    """The rows ``idx`` of ``rows`` (same padded length, so their log probabilities line up with the batch's)."""
    return Rows([rows.prompts[i] for i in idx], [rows.responses[i] for i in idx], rows.mask[idx], rows.teacher[idx],
                None if rows.topk_ids is None else rows.topk_ids[idx],
                None if rows.topk_logprobs is None else rows.topk_logprobs[idx], 0)


class ShardedLearner:
    """The learner over ``config.world_size`` FSDP2 ranks; same methods and counters as :class:`Learner`.

    Args:
        source: the HF model folder every rank (and the driver's CPU copy) loads.
        config: :class:`LearnerConfig` with ``world_size`` >= 2.
        ranks: builds the ranks from ``(world_size, setup kwargs)``; default :class:`ProcessRanks` (spawned here).
    """

    def __init__(self, source: str, config: LearnerConfig, ranks: RanksFactory | None = None) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        model, self.tokenizer = load_model(source, dtype=config.dtype, device="cpu")
        self._model = model.eval()
        self._vocab = model.get_input_embeddings().num_embeddings
        self.pad_id = Learner._pad_id(model, self.tokenizer)
        self.version = 0
        self.tokens_total = 0
        self.compute_s_total = 0.0
        self.skipped_updates = 0
        self.depth_stats = DepthStats() if config.depth_stats else None
        self.last_publish_s = 0.0
        self.failed: str | None = None
        self.last_update: UpdateStats | None = None  # what the newest update reported
        self.last_step: list[RankStep] = []  # every rank's reply to the newest update
        self._model_version = 0
        setup = {"source": str(source), "config": config.model_dump(mode="json"), "threads": torch.get_num_threads(),
                 "deterministic": torch.are_deterministic_algorithms_enabled()}
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
        turns, rows = batch_rows(batch, self.config, self._vocab)
        n = len(turns)
        weights, alpha = batch_row_weights(batch, rows, self.config, self.version)
        parts_idx = split_rows(n, self.world_size)
        subsets = [subset_rows(rows, idx) for idx in parts_idx]
        groups = [_micro_batches(sub, cfg.micro_batch_tokens) if len(sub.prompts) else [] for sub in subsets]
        depth = max(len(g) for g in groups)
        groups = [g + [np.zeros(0, dtype=np.int64)] * (depth - len(g)) for g in groups]
        total_valid = int(rows.mask.sum())
        args = [(sub, g, n, total_valid, None if weights is None else weights[idx])
                for sub, g, idx in zip(subsets, groups, parts_idx, strict=True)]
        replies: list[RankStep] = self._call("step", args)
        metrics = self._whole_batch_metrics(rows, parts_idx, replies, weights)
        self.version += 1
        tokens = sum(r.tokens for r in replies)
        compute_s = time.perf_counter() - t0
        self.tokens_total += tokens
        self.compute_s_total += compute_s
        self.skipped_updates += int(replies[0].skipped)
        self.last_step = replies
        self.last_update = UpdateStats(
            loss=metrics, grad_norm=replies[0].grad_norm, skipped=replies[0].skipped, tokens=tokens,
            tokens_total=self.tokens_total, input_slots=sum(r.input_slots for r in replies), compute_s=compute_s,
            compute_s_total=self.compute_s_total, version=self.version, truncated_prompts=rows.truncated_prompts,
            lr=cfg.lr, time_forward_backward_s=max(r.t_fb for r in replies),
            time_optimizer_s=max(r.t_opt for r in replies), row_weights=weights, alpha=alpha)
        if self.depth_stats is not None:
            self.depth_stats.update(turns)
        return self.last_update.metrics()

    def _whole_batch_metrics(self, rows: Rows, parts_idx: list[np.ndarray], replies: list[RankStep],
                             weights: np.ndarray | None) -> dict[str, float]:
        """The loss metrics of the whole batch from every rank's detached pieces, back in row order."""
        order, lp, old, top, scored = [], [], [], [], []
        for idx, reply in zip(parts_idx, replies, strict=True):
            for local, p_lp, p_old, p_top, p_scored in reply.parts:
                order.append(idx[local])
                lp.append(p_lp)
                old.append(p_old)
                top.append(p_top)
                scored.append(p_scored)
        perm = np.argsort(np.concatenate(order))

        def cat(arrays: list[Any]) -> torch.Tensor | None:
            return None if arrays[0] is None else torch.from_numpy(np.concatenate(arrays)[perm])

        with torch.no_grad():
            _, metrics = batch_loss(self.config, rows, np.arange(len(rows.prompts)), cat(lp), cat(old), cat(top),
                                    cat(scored), weights, torch.device("cpu"))
        return metrics

    # ------------------------------------------------------------------ publication and checkpoints
    def _gather(self) -> dict[str, torch.Tensor]:
        state = self._call("full_state_dict")[0]
        own = self._model.state_dict()
        for key in own:
            if key not in state and _is_tied(self._model, key):
                state[key] = state[next(k for k in own if own[k] is own[key] and k in state)]
        self._model.load_state_dict(state, strict=True)
        self._model_version = self.version
        return state

    def publish(self, path: str | Path | None = None) -> WeightHandle:
        """Rank 0 gathers the full state dict once per version; an in-memory handle, or (``path``) an HF folder."""
        t0 = time.perf_counter()
        state = self._gather()
        self.last_publish_s = time.perf_counter() - t0
        depth = None if self.depth_stats is None else self.depth_stats.published()
        if path is None:
            return WeightHandle(version=self.version, state_dict=state, depth_disagreement=depth)
        with atomic_dir(path) as tmp:
            self._model.save_pretrained(tmp)
        return WeightHandle(version=self.version, path=str(path), depth_disagreement=depth)

    def state(self) -> dict[str, Any]:
        return Learner.state(self)  # type: ignore[arg-type]

    def save_checkpoint(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """HF folder + tokenizer + ``dcp/`` (model and optimizer shards) + ``state.json``, atomically."""
        state = {
            "format": SHARDED_FORMAT,
            "world_size": self.world_size,
            "learner": self.state(),
            "config": self.config.model_dump(mode="json"),
            "rng": {"torch": encode_rng_state(torch.get_rng_state())},
            "extra_state": to_json_safe(extra_state or {}),
        }
        text = json.dumps(state, allow_nan=True)
        model = self.model
        with atomic_dir(path, manifest=True) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(tmp)
            self._call("save", [(str(tmp / DCP_DIR),)] * self.world_size)
            (tmp / "state.json").write_text(text)
        return Path(path)

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: LearnerConfig | None = None,
                        ranks: RanksFactory | None = None) -> tuple[ShardedLearner, dict[str, Any]]:
        """Resume from a sharded (any N, resharded) or a single-process checkpoint."""
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
    """The rank factory of ranks spawned on this machine (:class:`ProcessRanks`) whose collectives fail after
    ``collective_timeout_s`` seconds without a peer (``runtime.collective_timeout_s``): a stopped rank makes the
    others fail within that deadline, and the driver ends them all (:class:`LearnerRankError`); no rank answering a
    call within ``call_timeout_s`` (``runtime.rank_call_timeout_s``) does the same."""

    def make(world_size: int, setup: dict[str, Any]) -> Ranks:
        return ProcessRanks(world_size, {**setup, "collective_timeout_s": float(collective_timeout_s)},
                            call_timeout_s=call_timeout_s)

    return make


def build_learner(path: str, config: LearnerConfig, ranks: RanksFactory | None = None,
                  lora: LoraSettings | None = None) -> LearnerProtocol:
    """A fresh learner on the HF model at ``path``: one process (``world_size: 1``) or sharded; ``lora`` (rank > 0):
    a LoRA student (:mod:`divopd.learn.lora`; one process only)."""
    if lora is not None and lora.enabled and config.world_size > 1:
        check_lora(path, lora, config.world_size)  # one line: the sharded learner does not train adapters
    if config.world_size > 1:
        return ShardedLearner(path, config, ranks)
    model, tokenizer = load_model(path, dtype=config.dtype, device=config.device)
    if lora is not None and lora.enabled:
        add_adapter(model, lora, base=path, seed=config.seed)
    return Learner(model, config, tokenizer)


def learner_from_checkpoint(path: str | Path, config: LearnerConfig, ranks: RanksFactory | None = None
                            ) -> tuple[LearnerProtocol, dict[str, Any]]:
    """Resume any checkpoint (single-process or sharded, any N) with ``config.world_size`` ranks."""
    if config.world_size > 1 and is_adapter_folder(path):
        check_lora(str(path), LoraSettings(rank=1), config.world_size)  # the one line: LoRA is one process only
    if config.world_size > 1:
        return ShardedLearner.from_checkpoint(path, config, ranks)
    return Learner.from_checkpoint(path, config)

