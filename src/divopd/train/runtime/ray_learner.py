"""Learner ranks as Ray actors (``runtime.kind: ray``, ``learner.world_size > 1``) in one ``PACK`` placement group;
a rank that dies ends the others and raises :class:`~divopd.learn.ranks.LearnerRankError`, as with spawned ranks."""

from __future__ import annotations

from functools import partial
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from divopd.errors import first_line
from divopd.learn.dist_worker import RankWorker, free_port
from divopd.learn.ranks import REPLY_SLACK_S, LearnerRankError, ReplyDeadline
from divopd.train.config import TrainConfig
from divopd.train.runtime.ray import init_ray

__all__ = ["RankActor", "RayRanks", "ray_ranks"]

#: How long the placement group may wait for its bundles before the run stops with a message.
PLACEMENT_TIMEOUT_S = 300.0


class RankActor:
    """A :class:`RankWorker` inside a Ray actor."""

    def __init__(self) -> None:
        self.worker = RankWorker()

    def address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), free_port()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
        return getattr(self.worker, method)(*args, **(kwargs or {}))


class RayRanks:
    """``world_size`` :class:`RankActor` s in one placement group, one process group among them."""

    def __init__(self, cfg: TrainConfig, world_size: int, setup: dict[str, Any]) -> None:
        self._started = init_ray(cfg)
        self.world_size = world_size
        self._closed = False
        rt = cfg.runtime
        self._timeout_s = rt.collective_timeout_s
        self._call_timeout_s = rt.rank_call_timeout_s
        bundle = {"CPU": rt.learner_cpus, **({"GPU": rt.learner_gpus} if rt.learner_gpus else {}),
                  **rt.learner_resources}
        self._pg = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            self.close()
            raise LearnerRankError(
                f"the cluster cannot place {world_size} learner ranks of {bundle} each within "
                f"{PLACEMENT_TIMEOUT_S:.0f} s (cluster resources: {ray.cluster_resources()}); lower "
                "runtime.learner_cpus / learner_gpus or add nodes") from None
        cls = ray.remote(RankActor)
        self._actors = [
            cls.options(num_cpus=rt.learner_cpus, num_gpus=rt.learner_gpus, resources=dict(rt.learner_resources),
                        max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                            self._pg, placement_group_bundle_index=r)).remote()
            for r in range(world_size)]
        host, port = self._get([self._actors[0].address.remote()], "address", ranks=[0])[0]
        init_method = f"tcp://{host}:{port}"
        local = {"local_device": 0} if rt.learner_gpus else {}  # each actor sees its own GPU as cuda:0
        setup = {**setup, "collective_timeout_s": rt.collective_timeout_s}
        refs = [a.call.remote("setup", (r, world_size, init_method), {**setup, **local})
                for r, a in enumerate(self._actors)]
        self.info: list[dict[str, Any]] = self._get(refs, "setup")
        nodes = self._get([a.node_id.remote() for a in self._actors], "node_id")
        for info, node in zip(self.info, nodes, strict=True):
            info["ray_node_id"] = node

    def call(self, method: str, args: list[tuple[Any, ...]]) -> list[Any]:
        if self._closed:
            raise LearnerRankError("the sharded learner's ranks were stopped")
        return self._get([a.call.remote(method, args[r]) for r, a in enumerate(self._actors)], method)

    def _get(self, refs: list[Any], method: str, ranks: list[int] | None = None) -> list[Any]:
        """The replies in rank order. A failed rank, no first answer within ``runtime.rank_call_timeout_s``, or a rank
        later than ``runtime.collective_timeout_s`` (+ slack) after the first ends them all."""
        ranks = ranks if ranks is not None else list(range(len(refs)))
        index = {ref: r for ref, r in zip(refs, ranks, strict=True)}
        pending = list(refs)
        deadline = ReplyDeadline(self._call_timeout_s, self._timeout_s)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=deadline.wait_s())
            if not ready and deadline.first_answer is None:
                self.close()
                raise LearnerRankError(f"no learner rank of {self.world_size} (Ray actors) answered {method!r} within "
                                       f"runtime.rank_call_timeout_s = {self._call_timeout_s:g} s; the sharded "
                                       "learner stopped")
            if not ready:
                self.close()
                late = sorted(index[r] for r in pending)
                raise LearnerRankError(f"learner ranks {late} of {self.world_size} (Ray actors) gave no answer to "
                                       f"{method!r} within runtime.collective_timeout_s = {self._timeout_s:g} s "
                                       f"(+{REPLY_SLACK_S:g}) of the first rank's; the sharded learner stopped")
            deadline.answered()
            try:
                ray.get(ready[0], timeout=30)
            except (RayActorError, RayTaskError) as exc:
                self.close()
                raise LearnerRankError(f"learner rank {index[ready[0]]} of {self.world_size} (Ray actor) failed "
                                       f"during {method!r}: {first_line(exc)}; the sharded learner stopped") from None
        return ray.get(refs, timeout=30)

    def close(self) -> None:
        """End the rank actors, their placement group and Ray, when this started it."""
        if self._closed:
            return
        self._closed = True
        for actor in getattr(self, "_actors", []):
            ray.kill(actor, no_restart=True)
        remove_placement_group(self._pg)
        if self._started:
            ray.shutdown()


def ray_ranks(cfg: TrainConfig) -> Any:
    """The sharded learner's rank factory for ``cfg``: ``(world_size, setup) -> RayRanks``."""
    return partial(RayRanks, cfg)
