"""Ray runtime: the same Explorer and Trainer code, with explorers (and the evaluator) as Ray actors.

    ExplorerActor × N ──collect(1, weights_ref)──► driver: Trainer (queue + sampler + learner)
           ▲                                              │ publish → ray.put(handle)
           └──────────────── weights object ref ◄─────────┘
    EvalActor ◄── evaluate(weights_ref) futures; results written by the driver

The queue and the sampler live with the learner in the driver. Each explorer actor has one ``collect`` call in
flight, so a slow learner does not stall production (turns wait in the sampler, where staleness expires them). A dead
explorer actor is restarted by Ray (``runtime.max_explorer_restarts``) and its lost call is resubmitted; the run goes
on. Local runs start Ray on loopback; set ``runtime.ray_address`` (e.g. ``ray://head:10001`` or ``auto``) for a
cluster, and ``student.device``/``teacher.device`` + ``runtime.explorer_gpus`` for GPUs.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError

from divopd.config import TrainConfig
from divopd.runtime.common import build_explorer, load_teacher, step_limit
from divopd.trainer import Trainer

__all__ = ["run_ray", "ExplorerActor"]

log = logging.getLogger(__name__)


class ExplorerActor:
    """An Explorer inside a Ray actor (wrapped with ``ray.remote`` at the edge, in :func:`run_ray`)."""

    def __init__(self, cfg_data: dict[str, Any], idx: int, session: int, handle: Any, with_teacher: bool) -> None:
        cfg = TrainConfig.model_validate(cfg_data)
        torch.set_num_threads(cfg.runtime.torch_threads)
        self.cfg = cfg
        teacher = load_teacher(cfg)[0] if with_teacher else None
        self.explorer = build_explorer(cfg, idx, session, handle, teacher, evaluation=not with_teacher)

    def collect(self, n: int, handle: Any) -> list[Any]:
        self.explorer.set_weights(handle)
        self.explorer.config.max_steps = step_limit(self.cfg, handle.version)
        return self.explorer.collect(n)

    def evaluate(self, handle: Any, num_tasks: int) -> dict[str, float]:
        self.explorer.set_weights(handle)
        return self.explorer.evaluate(num_tasks=num_tasks)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.explorer.close()


def _init_ray(cfg: TrainConfig) -> bool:
    """Start (or connect to) Ray; returns True when this call started it."""
    if ray.is_initialized():
        return False
    if cfg.runtime.ray_address:
        ray.init(address=cfg.runtime.ray_address, log_to_driver=False)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=cfg.runtime.ray_num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 object_store_memory=512 * 2**20, log_to_driver=False)
    return True


def run_ray(trainer: Trainer, progress: Any = None) -> dict[str, Any]:
    """Run training with explorer actors; the learner stays in this (driver) process."""
    cfg = trainer.cfg
    started = _init_ray(cfg)
    session = trainer.state.sessions
    cfg_data = cfg.model_dump(mode="json")
    actor_cls = ray.remote(ExplorerActor)
    weights_ref = ray.put(trainer.publish())
    weights_version = trainer.version

    def new_explorer(i: int) -> Any:
        return actor_cls.options(num_cpus=cfg.runtime.explorer_cpus, num_gpus=cfg.runtime.explorer_gpus,
                                 max_restarts=cfg.runtime.max_explorer_restarts, max_task_retries=0,
                                 name=None).remote(cfg_data, i, session, weights_ref, True)

    explorers = [new_explorer(i) for i in range(cfg.runtime.num_explorers)]
    evaluator = actor_cls.options(num_cpus=0).remote(cfg_data, 999, session, weights_ref, False)
    inflight: dict[Any, int] = {e.collect.remote(1, weights_ref): i for i, e in enumerate(explorers)}
    evals: dict[Any, tuple[int, dict[str, float]]] = {}
    evaluated = {int(e["update"]) for e in trainer.state.eval_history}
    failures = [0] * len(explorers)

    def request_eval() -> None:
        if trainer.version not in evaluated:
            evaluated.add(trainer.version)
            evals[evaluator.evaluate.remote(weights_ref, cfg.eval.tasks)] = (trainer.version,
                                                                             trainer.snapshot_counters())

    def collect_evals(timeout: float = 0) -> None:
        if not evals:
            return
        ready, _ = ray.wait(list(evals), num_returns=len(evals), timeout=timeout)
        for ref in ready:
            update, counters = evals.pop(ref)
            results = ray.get(ref)
            trainer.record_eval(update, counters, results)
            if progress is not None:
                progress.on_eval(update, results)

    def poll(timeout: float) -> None:
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=timeout)
        if ready:  # take everything else that is already done too
            more, _ = ray.wait([r for r in inflight if r not in ready], num_returns=len(inflight) - 1, timeout=0) \
                if len(inflight) > 1 else ([], None)
            ready = ready + more
        for ref in ready:
            i = inflight.pop(ref)
            try:
                trainer.intake(ray.get(ref))
            except (RayActorError, RayTaskError) as exc:
                failures[i] += 1
                log.error("explorer actor %d failed (%d so far): %s", i, failures[i], exc)
                if failures[i] > cfg.runtime.max_explorer_restarts:
                    continue  # this explorer is given up; the others go on
            inflight[explorers[i].collect.remote(1, weights_ref)] = i

    if cfg.eval.at_start and trainer.version == 0:
        request_eval()
    deadline = None if cfg.max_seconds is None else time.monotonic() + cfg.max_seconds
    interrupted = False
    try:
        while trainer.version < cfg.updates:
            if deadline is not None and time.monotonic() > deadline:
                break
            if not inflight:
                raise RuntimeError("every explorer actor has failed; see the log above")
            poll(timeout=0)
            metrics = trainer.step()
            collect_evals()
            if metrics is None:
                poll(timeout=0.5)
                continue
            if trainer.version - weights_version >= 1:
                weights_ref = ray.put(trainer.publish())
                weights_version = trainer.version
            trainer.after_update(metrics, request_eval, progress)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if not interrupted:
            request_eval()
            collect_evals(timeout=600)
        for ref in list(inflight):
            ray.cancel(ref, force=True)
        for actor in [*explorers, evaluator]:
            ray.kill(actor, no_restart=True)
        trainer.checkpoint()
        if started:
            ray.shutdown()
    summary = trainer.close()
    summary["interrupted"] = interrupted
    summary["explorer_failures"] = sum(failures)
    return summary
