"""The sampler's config: a method, its seed, and the settings of :mod:`divopd.sampling.settings`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sampler_oracle.registry import get_method
from sampler_oracle.rules import pool_capacity
from sampler_oracle.settings import SAMPLER_SETTINGS, validate_setting

__all__ = ["SamplerConfig"]


@dataclass
class SamplerConfig:
    """Batch-selection settings (paper, Appendix Table 3).

    Attributes:
        method: selection rule, a name in ``divopd.sampling.METHODS``.
        batch_size: B, rows per learner update.
        pool_factor: c; pooled methods inspect up to ``ceil(c·B)`` pending + fresh turns per composition.
        cap: k, the first-pass per-rollout cap of rollout-first methods.
        max_staleness: a turn expires when ``learner_version − policy_version > max_staleness``.
        max_pending: at most this many unselected valid turns are kept; the oldest beyond it expire (None = no limit).
        seed: seeds the uniform within-rollout order (one permutation per composition).
        cap_unit: ``"turns"`` (the paper's cap) or ``"tokens"`` (token-share cap: first-pass allowance of
            ``cap × mean response length`` tokens per rollout; beyond the paper).
        max_pending_age: W (Algorithm 1, step 8); an unselected valid turn first seen more than W updates ago
            expires (``pending_age``). ``None`` = no age limit.
        group_order: how rollout-first methods order their rollout groups: ``"first-seen"`` (Algorithm 1, step 4:
            by the group's oldest first-seen update, ties by rollout id) or ``"arrival"`` (by the group's oldest
            arrival; the order before the appendix was available, kept as an option).
    """

    method: str
    batch_size: int
    pool_factor: float = 4
    cap: int = 4
    max_staleness: int = 2
    max_pending: int | None = None
    seed: int = 0
    cap_unit: str = "turns"
    max_pending_age: int | None = 8
    group_order: str = "first-seen"

    def __post_init__(self) -> None:
        get_method(self.method)  # raises a clear error for unknown names
        for setting in SAMPLER_SETTINGS:  # the one table of names, bounds and meanings
            validate_setting(setting, getattr(self, setting.name), "SamplerConfig")
        _require_int("seed", self.seed, 0)

    @property
    def pool_size(self) -> int:
        return pool_capacity(self.batch_size, self.pool_factor)


def _require_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"SamplerConfig.{name} must be an int >= {minimum}, got {value!r}")
