"""The sampler's config: a method, its seed, and the settings of :mod:`divopd.sampling.settings`."""

from __future__ import annotations

from dataclasses import dataclass

from divopd.sampling.registry import get_method
from divopd.sampling.rules import pool_capacity
from divopd.sampling.settings import SAMPLER_SETTINGS, Setting, validate_setting

__all__ = ["SamplerConfig"]

_SEED = Setting("seed", "int", 0, "seeds the uniform within-rollout order", minimum=0)


@dataclass
class SamplerConfig:
    """Batch-selection settings (paper, Appendix Table 3): ``method`` (a name in ``divopd.sampling.METHODS``),
    ``seed`` (of the uniform within-rollout order, one draw per composition) and the settings of
    :data:`~divopd.sampling.settings.SAMPLER_SETTINGS`, which holds each one's bound and meaning: B, c (pooled
    methods inspect up to ``ceil(c·B)`` turns), k, δ, ``max_pending``, ``cap_unit``, W and ``group_order``."""

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
        validate_setting(_SEED, self.seed, "SamplerConfig")

    @property
    def pool_size(self) -> int:
        return pool_capacity(self.batch_size, self.pool_factor)

