"""TCOD-F2B: the trajectory-depth curriculum baseline (Wang et al., 2026c, as described in the DivOPD paper).

The paper compares with TCOD, which "controls the trajectory depth exposed to the student and progressively expands
it from short to long with a curriculum schedule"; F2B is its front-to-back variant. In divopd that is one number: the
explorer's step limit (the rollout horizon) for the student at a given point of training. It starts at
``start_depth`` turns and grows to the environment's full step limit over the first ``expand_fraction`` of training,
then stays there. Batches are read as vanilla OPD reads them (arrival order, no pool, no gate): the baseline changes
which turns exist, not which are selected.

The paper does not give TCOD's schedule shape, so two are offered: ``linear`` (one more turn whenever the linear
ramp crosses an integer) and ``stages`` (``num_stages`` equal jumps). Example::

    cfg = TCODConfig(enabled=True, start_depth=3, expand_fraction=0.5, total_updates=200)
    step_limit = cfg.horizon(max_steps=30, update=learner_version)   # 3 at update 0, 30 from update 100 on
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TCODConfig", "tcod_horizon", "tcod_progress"]


def tcod_progress(update: int, total_updates: int) -> float:
    """Fraction of training done after ``update`` learner updates out of ``total_updates`` (clipped to [0, 1])."""
    if not isinstance(update, int) or update < 0:
        raise ValueError(f"update must be an int >= 0, got {update!r}")
    if not isinstance(total_updates, int) or total_updates < 1:
        raise ValueError(f"total_updates must be an int >= 1, got {total_updates!r}")
    return min(1.0, update / total_updates)


def tcod_horizon(
    progress: float,
    start_depth: int,
    max_steps: int,
    expand_fraction: float,
    schedule: Literal["linear", "stages"] = "linear",
    num_stages: int = 4,
) -> int:
    """TCOD-F2B's rollout horizon at training fraction ``progress`` (front to back).

    The horizon is ``start_depth`` at ``progress = 0`` and ``max_steps`` once ``progress >= expand_fraction``; in
    between it follows the ramp ``f = progress / expand_fraction``: ``linear`` gives
    ``start + floor(f · (max_steps − start))``, ``stages`` gives ``start + floor(floor(f · num_stages) / num_stages ·
    (max_steps − start))``. The result is an int in ``[min(start_depth, max_steps), max_steps]``, non-decreasing in
    ``progress``. A ``start_depth`` above ``max_steps`` is clipped to ``max_steps`` (no curriculum left).
    """
    if not isinstance(progress, (int, float)) or math.isnan(progress) or progress < 0:
        raise ValueError(f"progress must be a number >= 0, got {progress!r}")
    if not isinstance(start_depth, int) or start_depth < 1:
        raise ValueError(f"start_depth must be an int >= 1, got {start_depth!r}")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
    if not isinstance(expand_fraction, (int, float)) or not 0 < expand_fraction <= 1:
        raise ValueError(f"expand_fraction must be in (0, 1], got {expand_fraction!r}")
    if schedule not in ("linear", "stages"):
        raise ValueError(f"schedule must be 'linear' or 'stages', got {schedule!r}")
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")

    start = min(start_depth, max_steps)
    span = max_steps - start
    f = min(1.0, progress / expand_fraction)
    if schedule == "stages":
        f = math.floor(f * num_stages) / num_stages
    # the small epsilon keeps float noise (e.g. 0.3 / 0.6 · 10 = 4.999…) from costing a turn
    return start + min(span, math.floor(f * span + 1e-9))


class TCODConfig(BaseModel):
    """Settings of the TCOD-F2B baseline (config key ``tcod``).

    Attributes:
        enabled: run the curriculum; when False the explorer uses the full step limit throughout.
        start_depth: the horizon (turns per student rollout) at the start of training.
        expand_fraction: fraction of training over which the horizon grows to the full step limit.
        schedule: ``linear`` (one more turn at a time) or ``stages`` (``num_stages`` equal jumps).
        num_stages: number of jumps of the ``stages`` schedule.
        total_updates: learner updates in the run; needed to turn an update count into a training fraction.
        sampler_method: how batches are read; TCOD-F2B reads them as vanilla OPD does (fixed).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="run the TCOD-F2B horizon curriculum")
    start_depth: int = Field(2, ge=1, description="horizon (turns) at the start of training")
    expand_fraction: float = Field(0.5, gt=0, le=1, description="fraction of training to reach the full step limit")
    schedule: Literal["linear", "stages"] = Field("linear", description="growth shape: linear or stages")
    num_stages: int = Field(4, ge=1, description="number of equal jumps of the stages schedule")
    total_updates: int | None = Field(None, ge=1, description="learner updates in the run (update -> fraction)")
    sampler_method: Literal["vanilla"] = Field("vanilla", description="TCOD-F2B reads batches in arrival order")

    def horizon(self, max_steps: int, *, update: int | None = None, progress: float | None = None) -> int:
        """The explorer's step limit at learner ``update`` (or training fraction ``progress``): ``max_steps`` when
        the curriculum is off, :func:`tcod_horizon` otherwise."""
        if not self.enabled:
            return max_steps
        if (update is None) == (progress is None):
            raise ValueError("give exactly one of update= or progress=")
        if progress is None:
            if self.total_updates is None:
                raise ValueError("tcod.total_updates must be set to schedule by learner update")
            progress = tcod_progress(update, self.total_updates)
        return tcod_horizon(progress, self.start_depth, max_steps, self.expand_fraction, self.schedule, self.num_stages)
