"""One shared teacher actor for every Ray explorer (``teacher.shared: true``) and the explorers' handle on it. A
teacher dead for good fails every call at once: the turns arrive unscored and the watchdog stops the run (exit 3)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from divopd.errors import first_line
from divopd.experience.turn import ResponseScores
from divopd.explore.generation import Generation
from divopd.train.config import TrainConfig
from divopd.train.runtime.common import load_teacher
from divopd.train.watchdog import note_stall

__all__ = ["RemoteTeacher", "TeacherActor", "TeacherTimeoutError", "TeacherWatch", "start_shared_teacher"]

log = logging.getLogger(__name__)


class TeacherTimeoutError(RuntimeError):
    """A shared teacher call passed ``runtime.teacher_timeout_s``."""


class TeacherActor:
    """The teacher inside a Ray actor (:func:`start_shared_teacher`)."""

    def __init__(self, cfg_data: dict[str, Any]) -> None:
        cfg = TrainConfig.model_validate(cfg_data)
        torch.set_num_threads(cfg.runtime.torch_threads)
        self.teacher, self.tokenizer = load_teacher(cfg)
        self._topk = cfg.explorer.teacher_topk
        self.calls = 0

    def score_turns(self, prompts: list[list[int]], responses: list[list[int]]) -> list[ResponseScores]:
        self.calls += 1
        return self.teacher.score_turns(prompts, responses, topk=self._topk)

    def generate(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> list[Generation]:
        return self.teacher.generate(prompts, **kwargs)

    def stats(self) -> dict[str, float]:
        return {"teacher/calls": float(self.calls)}

    def pid(self) -> int:
        return os.getpid()


class RemoteTeacher:
    """The Teacher an explorer holds when the teacher is shared: the actor's calls, each within ``timeout_s`` (else
    :class:`TeacherTimeoutError`; the explorer retries the turns one by one, else leaves them unscored)."""

    def __init__(self, actor: Any, timeout_s: float = 600.0) -> None:
        self.actor = actor
        self.timeout_s = float(timeout_s)

    def _get(self, what: str, ref: Any) -> Any:
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except GetTimeoutError:
            raise TeacherTimeoutError(f"shared teacher actor: {what} gave no answer within "
                                      f"runtime.teacher_timeout_s = {self.timeout_s:g} s") from None

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[ResponseScores]:
        # topk is the run's explorer.teacher_topk, which the actor was built with
        return self._get("score_turns", self.actor.score_turns.remote([list(p) for p in prompts],
                                                                      [list(r) for r in responses]))

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]:
        kwargs = {"greedy": greedy, "temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed}
        return self._get("generate", self.actor.generate.remote([list(p) for p in prompts], kwargs))


class TeacherWatch:
    """The driver's watch on the shared teacher actor: one ``pid`` ping at a time; :meth:`check` (every poll) kills
    the actor for a restart when the ping is overdue by ``timeout_s``."""

    def __init__(self, actor: Any, timeout_s: float, max_restarts: int, every_s: float = 5.0) -> None:
        self.actor, self.timeout_s, self.max_restarts, self.every_s = actor, float(timeout_s), max_restarts, every_s
        self.restarts = 0  # restarts this watch asked for (Ray also restarts an actor that died by itself)
        self.dead: str | None = None  # why the actor is gone for good
        self._ping: Any = None
        self._sent = 0.0
        self._answered = time.monotonic()

    def check(self) -> None:
        """Send, collect or judge the ping; never blocks."""
        if self.dead is not None:
            return
        now = time.monotonic()
        if self._ping is None:
            if now - self._answered >= self.every_s:
                self._ping, self._sent = self.actor.pid.remote(), now
            return
        ready, _ = ray.wait([self._ping], timeout=0)
        if ready:
            try:
                ray.get(self._ping, timeout=0)
            except RayActorError as exc:  # restarts spent: the explorers' turns arrive unscored (watchdog rule)
                self.dead = first_line(exc)
                log.error("the shared teacher actor is dead for good (%s); its turns arrive unscored", self.dead)
                note_stall("teacher scoring", "the shared teacher actor", f"dead for good: {self.dead}")
            self._ping, self._answered = None, now
            return
        if now - self._sent >= self.timeout_s:
            self.restarts += 1
            log.error("stalled at teacher scoring: the shared teacher actor gave no answer for %.0f s "
                      "(runtime.teacher_timeout_s = %g); killing it for restart %d of runtime.max_teacher_restarts "
                      "= %d", now - self._sent, self.timeout_s, self.restarts, self.max_restarts)
            note_stall("teacher scoring", "the shared teacher actor", f"no answer for {now - self._sent:.0f} s, past "
                       f"runtime.teacher_timeout_s = {self.timeout_s:g}: killed for restart {self.restarts}")
            ray.kill(self.actor, no_restart=False)
            self._ping, self._answered = None, now


def start_shared_teacher(cfg: TrainConfig, cfg_data: dict[str, Any], name: str | None = None) -> Any | None:
    """The shared teacher actor of a run with ``teacher.shared`` (restarted ``runtime.max_teacher_restarts`` times,
    its calls retried), else ``None``."""
    if not cfg.teacher.shared:
        return None
    restarts = cfg.runtime.max_teacher_restarts
    return ray.remote(TeacherActor).options(num_cpus=0, num_gpus=cfg.teacher.actor_gpus, name=name,
                                            max_restarts=restarts, max_task_retries=restarts).remote(cfg_data)
