"""TCOD-F2B: the trajectory-depth curriculum baseline (Wang et al., 2026c, arXiv 2604.24005), read in its public code
(``github.com/kokolerk/TCOD``): a training episode runs ``d = 1 + step // η`` student turns, "step" being learner
updates + 1 (our reading). The rule and the other schedules: docs/concepts/environments.md (TCOD-F2B baseline)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TCODConfig", "tcod_depth", "tcod_horizon", "tcod_progress"]


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def tcod_depth(step: int, eta: int) -> int:
    """TCOD-F2B's student depth at (1-based) training step ``step``: ``d = 1 + ⌊step / η⌋`` turns."""
    _check_int("step", step, 0)
    _check_int("eta", eta, 1)
    return 1 + step // eta


def tcod_progress(update: int, total_updates: int) -> float:
    """Fraction of training done after ``update`` learner updates out of ``total_updates`` (clipped to [0, 1])."""
    _check_int("update", update, 0)
    _check_int("total_updates", total_updates, 1)
    return min(1.0, update / total_updates)


def tcod_horizon(progress: float, start_depth: int, max_steps: int, expand_fraction: float,
                 schedule: Literal["linear", "stages"] = "linear", num_stages: int = 4) -> int:
    """The non-default ``linear`` / ``stages`` horizons at training fraction ``progress`` (not TCOD's rule):
    ``start_depth`` (clipped to ``max_steps``) at 0, ``max_steps`` from ``expand_fraction`` on, in between ``start +
    floor(f · (max_steps − start))`` with ``f = progress / expand_fraction`` (``stages``: ``f`` floored to
    ``1 / num_stages`` steps). Non-decreasing in ``progress``."""
    if not isinstance(progress, (int, float)) or math.isnan(progress) or progress < 0:
        raise ValueError(f"progress must be a number >= 0, got {progress!r}")
    _check_int("start_depth", start_depth, 1)
    _check_int("max_steps", max_steps, 1)
    if not isinstance(expand_fraction, (int, float)) or not 0 < expand_fraction <= 1:
        raise ValueError(f"expand_fraction must be in (0, 1], got {expand_fraction!r}")
    if schedule not in ("linear", "stages"):
        raise ValueError(f"schedule must be 'linear' or 'stages', got {schedule!r}")
    _check_int("num_stages", num_stages, 1)

    start = min(start_depth, max_steps)
    span = max_steps - start
    f = min(1.0, progress / expand_fraction)
    if schedule == "stages":
        f = math.floor(f * num_stages) / num_stages
    # the small epsilon keeps float noise (e.g. 0.3 / 0.6 · 10 = 4.999…) from costing a turn
    return start + min(span, math.floor(f * span + 1e-9))


class TCODConfig(BaseModel):
    """Settings of the TCOD-F2B baseline (config key ``tcod``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Run the TCOD-F2B depth curriculum (the tcod-f2b method row).")
    schedule: Literal["paper", "linear", "stages"] = Field("paper", description=(
        "paper: TCOD's rule, the student plays d = 1 + floor(step / eta) turns at training step step = learner "
        "updates + 1, capped by explorer.max_steps; linear / stages: earlier ramps from start_depth to the full "
        "limit over expand_fraction of total_updates (not TCOD's)."))
    eta: int = Field(6, ge=1, description=(
        "η (TCOD's checkpoint_steps): the depth grows by one turn every η training steps (its configs: 6 on ALFWorld "
        "and ScienceWorld, 4 on WebShop)."))
    start_depth: int = Field(2, ge=1, description="linear / stages only: the horizon (turns) at the start of training.")
    expand_fraction: float = Field(0.5, gt=0, le=1, description=(
        "linear / stages only: fraction of training by which the full step limit is reached."))
    num_stages: int = Field(4, ge=1, description="stages only: number of equal jumps.")
    total_updates: int | None = Field(None, ge=1, description=(
        "linear / stages only: learner updates in the run (default: the run's updates)."))
    sampler_method: Literal["vanilla"] = Field("vanilla", description="TCOD-F2B reads batches in arrival order.")

    def horizon(self, max_steps: int, *, update: int | None = None, progress: float | None = None) -> int:
        """The training explorer's step limit after ``update`` learner updates: ``max_steps`` when the curriculum is
        off; ``min(max_steps, 1 + ⌊(update + 1) / η⌋)`` for ``schedule: paper``; :func:`tcod_horizon` at ``update``
        (or training fraction ``progress``) for ``linear`` / ``stages``."""
        _check_int("max_steps", max_steps, 1)
        if not self.enabled:
            return max_steps
        if self.schedule == "paper":
            if update is None or progress is not None:
                raise ValueError("schedule 'paper' needs update= (learner updates done), not progress=")
            return min(max_steps, tcod_depth(update + 1, self.eta))
        if (update is None) == (progress is None):
            raise ValueError("give exactly one of update= or progress=")
        if progress is None:
            if self.total_updates is None:
                raise ValueError("tcod.total_updates must be set to schedule by learner update")
            progress = tcod_progress(update, self.total_updates)
        return tcod_horizon(progress, self.start_depth, max_steps, self.expand_fraction, self.schedule, self.num_stages)
