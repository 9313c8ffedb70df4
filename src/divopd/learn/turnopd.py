"""TurnOPD (Zhou et al., 2026, arXiv 2607.05804; no public code), our reading as the ``turnopd`` method row
(docs/concepts/environments.md): an adaptive rollout-depth budget (:func:`depth_budget` over :class:`DepthStats`) and a
loss moving from token-level to turn-balanced row weights (:func:`turn_balance_weights` at :func:`turn_balance_alpha`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from divopd.experience.turn import Turn

__all__ = ["DEPTH_EMA", "TurnOPDConfig", "DepthStats", "depth_budget", "turn_balance_alpha", "turn_balance_weights"]

#: Rate of the per-depth exponential moving average of disagreement (our choice).
DEPTH_EMA = 0.1


class TurnOPDConfig(BaseModel):
    """TurnOPD's adaptive depth budget (config key ``turnopd``; its loss schedule: ``learner.turn_balance_updates``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Run TurnOPD's adaptive rollout-depth budget (the turnopd method row; "
                          "needs learner.depth_stats and learner.turn_balance_updates).")
    rho: float = Field(0.9, gt=0, le=1, description="ρ: the step limit covers the depths that carry this fraction of "
                       "the running per-depth disagreement mass (our reading of TurnOPD).")
    min_depth: int = Field(2, ge=1, description="The depth budget never goes below this many turns.")

    def step_limit(self, max_steps: int, depth_disagreement: Sequence[float | None] | None) -> int:
        """The training step limit: :func:`depth_budget` when enabled, ``max_steps`` otherwise."""
        if not self.enabled:
            return max_steps
        return depth_budget(depth_disagreement, self.rho, self.min_depth, max_steps)


def depth_budget(depth_disagreement: Sequence[float | None] | None, rho: float, min_depth: int, max_steps: int) -> int:
    """The training step limit: the smallest d ≥ 1 with Σ_{t<d} m_t ≥ ρ·Σ_t m_t, clipped to [min(min_depth, max_steps),
    max_steps]; ``max_steps`` without statistics (every m_t 0). ``None`` entries (depths never seen) count 0."""
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    mass = [float(m) if m is not None and math.isfinite(m) and m > 0 else 0.0 for m in (depth_disagreement or ())]
    total = sum(mass)
    if total <= 0:
        return max_steps
    target = rho * total * (1 - 1e-12)  # float noise must not cost a turn
    d = next((t + 1 for t, run in enumerate(accumulate(mass)) if run >= target), len(mass))
    return max(min(min_depth, max_steps), min(d, max_steps))


class DepthStats:
    """The learner's per-depth means m_t (depth = ``Turn.turn_index``): an EMA (rate ``DEPTH_EMA``) of the batch mean
    of ``max(s(u), 0)`` over its turns at that depth with a valid token; the first batch with a depth sets m_t, a depth
    a batch lacks keeps its value."""

    def __init__(self, means: Sequence[float | None] = (), rate: float = DEPTH_EMA) -> None:
        self.means: list[float | None] = [None if m is None else float(m) for m in means]
        self.rate = rate

    def update(self, turns: Sequence[Turn]) -> None:
        """Fold one batch in: per depth, the mean of ``max(s(u), 0)`` over its turns with a valid token."""
        by_depth: dict[int, list[float]] = {}
        for t in turns:
            if t.n_valid > 0:
                by_depth.setdefault(t.turn_index, []).append(max(t.disagreement, 0.0))
        if not by_depth:
            return
        self.means.extend([None] * (max(by_depth) + 1 - len(self.means)))
        for d, values in by_depth.items():
            batch_mean = sum(values) / len(values)
            old = self.means[d]
            self.means[d] = batch_mean if old is None else (1 - self.rate) * old + self.rate * batch_mean

    def published(self) -> tuple[float | None, ...]:
        return tuple(self.means)


def turn_balance_alpha(update: int, updates: int) -> float:
    """α(q) = min(1, q / (U − 1)) for the update after ``update`` = q updates (U = ``updates``; α = 1 when U = 1)."""
    if update < 0 or updates < 1:
        raise ValueError(f"need update >= 0 and updates >= 1, got {update}, {updates}")
    return min(1.0, update / max(updates - 1, 1)) if updates > 1 else 1.0


def turn_balance_weights(valid_tokens: Sequence[int] | np.ndarray, alpha: float) -> np.ndarray:
    """Row weights ``(1 − α)·N·|V_t|/Σ|V| + α`` (|V_t|: a row's valid tokens): the token-mean loss at α = 0, the
    turn-balanced loss at α = 1; they average 1 (all 1 when no row has a valid token)."""
    v = np.asarray(valid_tokens, dtype=np.float64)
    n, total = len(v), float(v.sum())
    if total <= 0:
        return np.ones(n, dtype=np.float64)
    return (1.0 - alpha) * (n * v / total) + alpha
