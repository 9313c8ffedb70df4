"""The one place a training run is assembled (:func:`open_run`, :func:`run_trainer`), and the only module outside
``train/runtime/`` that imports a runtime, each lazily. A runtime is one :class:`RuntimeEntry` in :data:`RUNTIMES`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from divopd.learn.checkpoint import WeightHandle
from divopd.learn.protocol import LearnerProtocol
from divopd.learn.sharded import RanksFactory, build_learner, learner_from_checkpoint, process_ranks
from divopd.train.config import TrainConfig
from divopd.train.interrupt import StopRequest, fault_point
from divopd.train.loop import run_loop
from divopd.train.protocol import Runtime
from divopd.train.rundir import EXPERIENCE, open_run_dir
from divopd.train.runtime.common import build_explorer, check_vocabularies, fresh_session, logged_rollout_ids
from divopd.train.trainer import Trainer

__all__ = ["RUNTIMES", "RuntimeEntry", "build_explorer", "check_vocabularies", "make_learner", "open_run",
           "run_trainer"]


@dataclass(frozen=True)
class RuntimeEntry:
    """One runtime kind. ``build(cfg, weights, trainer)``: the Runtime, its explorers holding ``weights``;
    ``session(cfg)``: a context around the whole run; ``learner_ranks(cfg)``: the sharded learner's rank factory."""

    build: Callable[[TrainConfig, WeightHandle, Trainer], Runtime]
    session: Callable[[TrainConfig], ContextManager[Any]] = lambda cfg: contextlib.nullcontext()
    learner_ranks: Callable[[TrainConfig], RanksFactory | None] = lambda cfg: process_ranks(
        cfg.runtime.collective_timeout_s, cfg.runtime.rank_call_timeout_s)


def _session(trainer: Trainer) -> int:
    return fresh_session(trainer.state.sessions, logged_rollout_ids(trainer.run_dir / EXPERIENCE))


def _lockstep(cfg: TrainConfig, weights: WeightHandle, trainer: Trainer) -> Runtime:
    from divopd.train.runtime.lockstep import LockstepRuntime

    return LockstepRuntime(cfg, weights, _session(trainer))


def _lockstep_session(cfg: TrainConfig) -> ContextManager[Any]:
    from divopd.train.runtime.lockstep import deterministic_torch

    return deterministic_torch()


def _threads(cfg: TrainConfig, weights: WeightHandle, trainer: Trainer) -> Runtime:
    from divopd.train.runtime.threads import ThreadsRuntime

    return ThreadsRuntime(cfg, weights, _session(trainer))


def _ray(cfg: TrainConfig, weights: WeightHandle, trainer: Trainer) -> Runtime:
    from divopd.train.runtime.ray import RayRuntime

    return RayRuntime(cfg, weights, _session(trainer), trainer.learner.rank_info)


def _ray_ranks(cfg: TrainConfig) -> RanksFactory:
    from divopd.train.runtime.ray_learner import ray_ranks

    return ray_ranks(cfg)


RUNTIMES: dict[str, RuntimeEntry] = {
    "lockstep": RuntimeEntry(_lockstep, session=_lockstep_session),
    "threads": RuntimeEntry(_threads),
    "ray": RuntimeEntry(_ray, learner_ranks=_ray_ranks),
}


def make_learner(cfg: TrainConfig, checkpoint: Path | None) -> tuple[LearnerProtocol, dict[str, Any]]:
    """The run's learner, fresh or from ``checkpoint``, with the checkpoint's ``extra_state``."""
    ranks = RUNTIMES[cfg.runtime.kind].learner_ranks(cfg) if cfg.learner.world_size > 1 else None
    if checkpoint is not None:
        return learner_from_checkpoint(checkpoint, cfg.learner, ranks)
    return build_learner(cfg.student.path, cfg.learner, ranks, lora=cfg.student.lora), {}


def open_run(cfg: TrainConfig | None = None, *, resume: str | Path | None = None) -> tuple[Trainer, bool]:
    """Open (or ``resume``) a run directory; returns ``(trainer, resumed)``, the trainer holding its lock."""
    opened = open_run_dir(cfg, resume)
    try:
        fault_point("load")
        learner, extra = make_learner(opened.cfg, opened.checkpoint)
        return Trainer.open(opened, learner, extra), opened.checkpoint is not None
    except BaseException:
        opened.held.close()  # the lock goes with the failure; on success the trainer holds it
        raise


def run_trainer(trainer: Trainer, progress: Any = None, stop: StopRequest | None = None) -> dict[str, Any]:
    """Build the runtime of ``runtime.kind`` around ``trainer`` and run the one loop to the end; returns the summary."""
    cfg = trainer.cfg
    entry = RUNTIMES[cfg.runtime.kind]
    with entry.session(cfg):
        weights = trainer.publish()  # what every explorer starts from
        runtime = entry.build(cfg, weights, trainer)
        return run_loop(trainer, runtime, weights=weights, stop=stop, progress=progress)
