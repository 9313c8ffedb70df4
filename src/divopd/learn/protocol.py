"""The one learner interface the trainer and the assembly see (:class:`LearnerProtocol`): :class:`Learner
<divopd.learn.learner.Learner>` (one process) and :class:`ShardedLearner <divopd.learn.sharded.ShardedLearner>`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from divopd.experience.turn import Turn
from divopd.learn.checkpoint import WeightHandle
from divopd.learn.update import UpdateStats
from divopd.sampling.sampler import Batch

__all__ = ["LearnerProtocol"]


@runtime_checkable
class LearnerProtocol(Protocol):
    """One optimizer update per composed batch, versioned weights, atomic checkpoints."""

    #: updates taken so far (the policy version of the newest weights)
    version: int
    #: prompt + response tokens processed over every update (the paper's learner-token axis)
    tokens_total: int
    #: wall seconds inside ``step`` over every update (the CPU stand-in for trainer GPU-hours)
    compute_s_total: float
    #: ``None`` while the learner works; after a rank died (sharded), what happened: nothing more can be written
    failed: str | None
    #: what the newest update reported (``None`` before the first)
    last_update: UpdateStats | None

    @property
    def model(self) -> torch.nn.Module:
        """The full model with the current weights (the Appendix-E diagnostics read it)."""
        ...

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        """Where each learner rank runs (``rank``, ``pid``, ``node``, ``device``, ...); empty for one process."""
        ...

    def step(self, batch: Batch | Sequence[Turn]) -> dict[str, float]:
        """Exactly one optimizer update on ``batch``; returns its ``learner/*`` metrics (``last_update.metrics()``)."""
        ...

    def publish(self, path: str | Path | None = None) -> WeightHandle:
        """A handle on the current weights for the explorers (in memory, or an HF folder at ``path``)."""
        ...

    def save_checkpoint(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """Model, optimizer, counters, RNG and ``extra_state`` (JSON), written atomically to ``path``."""
        ...

    def close(self) -> None:
        """Release what the learner holds (a sharded learner's ranks); idempotent."""
        ...
