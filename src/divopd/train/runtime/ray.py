"""Ray runtime: explorers (and the evaluator) as Ray actors, one ``collect`` call each in flight; a dead actor is
restarted by Ray (``runtime.max_explorer_restarts``) and its call resubmitted; bad input only an actor meets is raised
by the driver as it is (one line, exit 2). Every other ``ray.get`` here waits 30 s at most."""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any

import ray
import torch
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from divopd.errors import UsageError, first_line
from divopd.explore.children import sigint_blocked
from divopd.explore.explorer import Rollout
from divopd.learn.checkpoint import WeightHandle
from divopd.train.config import TrainConfig
from divopd.train.protocol import EvalResult, StatelessRuntime
from divopd.train.runtime.common import build_explorer, load_teacher
from divopd.train.runtime.ray_teacher import RemoteTeacher, TeacherWatch, start_shared_teacher
from divopd.train.watchdog import note_stall

__all__ = ["RayRuntime", "ExplorerActor", "actor_incarnation", "explorer_name", "init_ray", "teacher_name"]

log = logging.getLogger(__name__)

#: how long a normal stop waits for the collect calls in flight to finish (a Ctrl-C / SIGTERM takes only finished ones)
SHUTDOWN_COLLECT_S = 30.0


class ExplorerActor:
    """An Explorer inside a Ray actor. Its constructor takes no weight handle (nothing for a restart to fetch
    again): the weights come with each ``collect`` / ``evaluate`` call, so a restarted actor takes the newest."""

    def __init__(self, cfg_data: dict[str, Any], idx: int, session: int, with_teacher: bool,
                 teacher_actor: Any = None) -> None:
        cfg = TrainConfig.model_validate(cfg_data)
        torch.set_num_threads(cfg.runtime.torch_threads)
        self.cfg = cfg
        self.input_error: UsageError | None = None  # raised from every call: no restart can fix bad input
        teacher = None  # the shared teacher actor (teacher.shared), else a teacher of this actor's own
        self.incarnation = actor_incarnation()  # Ray re-runs __init__ on a restart: new rollout ids and seed
        try:
            if with_teacher:
                teacher = (RemoteTeacher(teacher_actor, cfg.runtime.teacher_timeout_s) if teacher_actor is not None
                           else load_teacher(cfg)[0])
            self.explorer = build_explorer(cfg, idx, session, None, teacher, evaluation=not with_teacher,
                                           incarnation=self.incarnation)
        except UsageError as exc:
            self.input_error = exc

    def _check_input(self) -> None:
        if self.input_error is not None:
            raise self.input_error

    def collect(self, n: int, handle: Any) -> list[Any]:
        self._check_input()
        self.explorer.set_weights(handle)  # its step limit follows the handle
        return self.explorer.collect(n)

    def evaluate(self, handle: Any, num_tasks: int) -> dict[str, float]:
        self._check_input()
        self.explorer.set_weights(handle)
        return self.explorer.evaluate(num_tasks=num_tasks, **self.cfg.eval.sampling(self.cfg.seed))

    def pid(self) -> int:
        return os.getpid()

    def identity(self) -> dict[str, Any]:
        self._check_input()
        return {"incarnation": self.incarnation, "seed": self.explorer.seed, "id_prefix": self.explorer.id_prefix}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        if self.input_error is None:
            self.explorer.close()


_RUNTIMES = itertools.count()


def actor_incarnation() -> int:
    """How many times Ray has restarted the calling actor (0 for its first start, and outside an actor)."""
    if not ray.is_initialized():  # outside Ray altogether (asking the runtime context would start Ray here)
        return 0
    context = ray.get_runtime_context()
    if context.get_actor_id() is None or not context.was_current_actor_reconstructed:
        return 0
    from ray._private.state import actors  # the count behind the public flag; no public accessor in Ray 2.60

    info = actors(actor_id=context.get_actor_id()) or {}
    return max(1, int(info.get("NumRestarts", 1)))


def raise_input_error(exc: Exception) -> None:
    """Raise the :class:`~divopd.errors.UsageError` behind a failed actor call as it is; return for any other."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, UsageError):
        raise cause from None


def explorer_name(run: int, i: int) -> str:
    """The Ray actor name of explorer ``i`` of this driver's ``run``-th runtime."""
    return f"divopd-explorer-{os.getpid()}-{run}-{i}"


def teacher_name(run: int) -> str:
    """The Ray actor name of the shared teacher of this driver's ``run``-th runtime."""
    return f"divopd-teacher-{os.getpid()}-{run}"


def init_ray(cfg: TrainConfig) -> bool:
    """Start (or connect to) Ray; returns True when this call started it."""
    if ray.is_initialized():
        return False
    if cfg.runtime.ray_address:
        ray.init(address=cfg.runtime.ray_address, log_to_driver=False)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        with sigint_blocked():  # its processes ignore a terminal's Ctrl-C (Ray blocks it too); ray.shutdown ends them
            ray.init(num_cpus=cfg.runtime.ray_num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=512 * 2**20, log_to_driver=False)
    return True


class RayRuntime(StatelessRuntime):
    """The Runtime of explorer actors; ``learner_ranks``: the learner's ``rank_info``, for ``placement``."""

    def __init__(self, cfg: TrainConfig, weights: WeightHandle, session: int,
                 learner_ranks: list[dict[str, Any]] | None = None) -> None:
        self.cfg = cfg
        self._learner_ranks = list(learner_ranks or [])
        self._nodes: list[str | None] = []  # where each explorer actor ran (read at shutdown)
        self._run = next(_RUNTIMES)
        self._started = init_ray(cfg)
        self._cfg_data = cfg.model_dump(mode="json")
        self._actor_cls = ray.remote(ExplorerActor)
        self._weights_ref = ray.put(weights)
        self._weights_version = weights.version
        self._teacher = start_shared_teacher(cfg, self._cfg_data, teacher_name(self._run))
        rt = cfg.runtime
        self._teacher_watch = (None if self._teacher is None
                               else TeacherWatch(self._teacher, rt.teacher_timeout_s, rt.max_teacher_restarts))
        self._explorers = [self._actor_cls.options(
            num_cpus=rt.explorer_cpus, num_gpus=rt.explorer_gpus, resources=dict(rt.explorer_resources),
            max_restarts=rt.max_explorer_restarts, max_task_retries=0, name=explorer_name(self._run, i),
        ).remote(self._cfg_data, i, session, True, self._teacher) for i in range(rt.num_explorers)]
        self._node_refs = [e.node_id.remote() for e in self._explorers]  # runs before each actor's first collect
        self._evaluator = self._actor_cls.options(num_cpus=0).remote(self._cfg_data, 999, session, False)
        self._inflight: dict[Any, int] = {}
        self._submitted: dict[Any, float] = {}  # each collect call in flight → when it was submitted (its deadline)
        self._overdue: set[Any] = set()  # collect calls past runtime.explorer_timeout_s whose actor was killed
        for i in range(len(self._explorers)):
            self._submit(i)
        self._evals: dict[Any, tuple[int, dict[str, float]]] = {}
        self._failures = [0] * len(self._explorers)
        self._restarting = [False] * len(self._explorers)  # its death is counted; calls fail until it is back
        self._parked: dict[int, float] = {}  # explorer → when to resubmit its call (its actor is restarting)
        self.stalled_restarts = 0  # explorer actors killed for a restart at runtime.explorer_timeout_s
        self.produced_turns = 0  # turns of the collect calls that finished (all of them reach the loop)

    def _submit(self, i: int) -> None:
        ref = self._explorers[i].collect.remote(1, self._weights_ref)
        self._inflight[ref] = i
        self._submitted[ref] = time.monotonic()

    def _take(self, ref: Any) -> list[Rollout]:
        self._submitted.pop(ref, None)
        self._overdue.discard(ref)
        rollouts = ray.get(ref, timeout=30)
        self.produced_turns += sum(len(r.turns) for r in rollouts)
        return rollouts

    def _restart_overdue(self) -> None:
        """Kill, for Ray to restart, each explorer actor whose collect call passed ``runtime.explorer_timeout_s``."""
        limit = self.cfg.runtime.explorer_timeout_s
        now = time.monotonic()
        for ref, t0 in list(self._submitted.items()):
            if ref in self._overdue or now - t0 < limit:
                continue
            i = self._inflight[ref]
            self._overdue.add(ref)
            self.stalled_restarts += 1
            log.error("stalled at explore: explorer actor %d gave no rollout for %.0f s (runtime.explorer_timeout_s "
                      "= %g); killing it for a restart", i, now - t0, limit)
            note_stall("explore", f"Ray explorer actor {i}", f"no rollout for {now - t0:.0f} s, past "
                       f"runtime.explorer_timeout_s = {limit:g}: killed for a restart")
            ray.kill(self._explorers[i], no_restart=False)

    def poll(self, timeout: float) -> list[Rollout]:
        if self._teacher_watch is not None:
            self._teacher_watch.check()
        self._restart_overdue()
        now = time.monotonic()
        for i, at in list(self._parked.items()):
            if now >= at:
                del self._parked[i]
                self._submit(i)
        if not self._inflight:
            time.sleep(min(timeout, 0.1))
            return []
        refs = list(self._inflight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and len(refs) > 1:  # take everything else that is already done too
            more, _ = ray.wait([r for r in refs if r not in ready], num_returns=len(refs) - 1, timeout=0)
            ready = ready + more
        out: list[Rollout] = []
        for ref in ready:
            i = self._inflight.pop(ref)
            try:
                out.extend(self._take(ref))
                self._restarting[i] = False
            except ActorUnavailableError:  # restarting (the death was counted when it was seen): ask again soon
                if not self._restarting[i]:
                    self._count_failure(i, "its actor is restarting")
                if self._failures[i] <= self.cfg.runtime.max_explorer_restarts:
                    self._parked[i] = time.monotonic() + 1.0
                continue
            except (RayActorError, RayTaskError, ray.exceptions.GetTimeoutError) as exc:
                raise_input_error(exc)
                self._count_failure(i, str(exc))
                self._restarting[i] = isinstance(exc, RayActorError)
                if self._failures[i] > self.cfg.runtime.max_explorer_restarts:
                    continue  # this explorer is given up; the others go on
            self._submit(i)
        return out

    def _count_failure(self, i: int, why: str) -> None:
        self._failures[i] += 1
        self._restarting[i] = True
        log.error("explorer actor %d failed (%d so far): %s", i, self._failures[i], why)

    def check_alive(self) -> None:
        if not self._inflight and not self._parked:
            raise RuntimeError("every explorer actor has failed; see the log above")

    def publish(self, handle: WeightHandle) -> None:
        if handle.version > self._weights_version:  # one object per version, shared by every actor
            self._weights_ref = ray.put(handle)
            self._weights_version = handle.version

    def request_eval(self, update: int, handle: WeightHandle, counters: dict[str, float]) -> None:
        ref = self._weights_ref if handle.version == self._weights_version else ray.put(handle)
        self._evals[self._evaluator.evaluate.remote(ref, self.cfg.eval.tasks)] = (update, counters)

    def eval_results(self, timeout: float) -> list[EvalResult]:
        if not self._evals:
            return []
        ready, _ = ray.wait(list(self._evals), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self._evals), num_returns=len(self._evals), timeout=0)
        out = []
        for ref in ready:
            update, counters = self._evals.pop(ref)
            try:
                results = ray.get(ref, timeout=30)
            except RayTaskError as exc:
                raise_input_error(exc)
                raise
            out.append(EvalResult(update, counters, results))
        return out

    def evals_pending(self) -> bool:
        return bool(self._evals)

    def placement(self) -> list[str | None]:
        """The Ray node id each explorer actor started on (``None``: no answer)."""
        out: list[str | None] = []
        for ref in self._node_refs:
            try:
                out.append(ray.get(ref, timeout=30))
            except (RayActorError, RayTaskError, ray.exceptions.GetTimeoutError):
                out.append(None)
        return out

    def shutdown(self, interrupted: bool) -> list[Rollout]:
        self._nodes = self.placement()
        finished = self._finished_collects(0.0 if interrupted else SHUTDOWN_COLLECT_S)
        for actor in self._explorers:
            ray.kill(actor, no_restart=True)
        finished += self._finished_collects(0.0)  # a call that finished just before its actor was killed
        self._inflight.clear()  # killing an actor ended the collect calls still running: never produced
        return finished

    def _finished_collects(self, timeout: float) -> list[Rollout]:
        """The rollouts of the collect calls in flight that finish within ``timeout`` seconds."""
        refs = list(self._inflight)
        if not refs:
            return []
        ready, running = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        out: list[Rollout] = []
        for ref in ready:
            i = self._inflight.pop(ref)
            try:
                out.extend(self._take(ref))
            except (RayActorError, RayTaskError, ray.exceptions.GetTimeoutError) as exc:
                log.info("explorer actor %d ended at the stop without finishing its rollout: %s", i, first_line(exc))
        if running and timeout > 0:
            log.info("stop: %d explorer rollouts still running end unfinished (never produced, never received)",
                     len(running))
        return out

    def close(self, interrupted: bool) -> dict[str, Any]:
        ray.kill(self._evaluator, no_restart=True)
        teacher: dict[str, Any] = {}
        if self._teacher is not None:  # the shared teacher's call count goes into the summary
            try:
                teacher = ray.get(self._teacher.stats.remote(), timeout=30)
            except (RayActorError, RayTaskError, ray.exceptions.GetTimeoutError) as exc:
                log.warning("the shared teacher actor gave no stats at the stop: %s", first_line(exc))
            assert self._teacher_watch is not None
            teacher["teacher_restarts"] = self._teacher_watch.restarts
            ray.kill(self._teacher, no_restart=True)
        self._evals.clear()
        if self._started:
            ray.shutdown()
        return {"explorer_failures": sum(self._failures), "explorer_stalled_restarts": self.stalled_restarts,
                "produced_turns": self.produced_turns, **teacher,
                "placement": {"explorers": self._nodes,
                              "learner_ranks": [r.get("ray_node_id") for r in self._learner_ranks]}}
