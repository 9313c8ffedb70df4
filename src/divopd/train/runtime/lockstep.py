"""Lockstep runtime (``runtime.kind: lockstep``): one process, no threads, deterministic. Before each update the env
instances advance round-robin by ``runtime.lockstep.env_steps_per_update`` steps (a round's extra steps carried over);
checkpoints hold its state, and a resume replays each running episode, so a killed run continues exactly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from divopd.explore.explorer import Explorer, Rollout
from divopd.explore.replay import ReplayError, save_student
from divopd.explore.weight_loading import close_backend
from divopd.learn.checkpoint import WeightHandle
from divopd.train.config import TrainConfig
from divopd.train.interrupt import fault_point
from divopd.train.protocol import EvalResult
from divopd.train.runtime.common import build_explorer, load_teacher

__all__ = ["LockstepRuntime", "deterministic_torch"]

#: The format of :meth:`LockstepRuntime.state_dict`.
STATE_FORMAT = 1


class LockstepRuntime:
    """The :class:`~divopd.train.protocol.Runtime` that steps every env instance from the loop's own thread."""

    evaluates_in_place = True
    keeps_state = True
    producer_intervals = 0  # polls so far: each is one learner step's worth of production

    def __init__(self, cfg: TrainConfig, weights: WeightHandle, session: int) -> None:
        self.cfg = cfg
        self._session = session
        self._latest = weights  # the newest weights published (a checkpoint holds them)
        self._teacher, _ = load_teacher(cfg)
        self._explorers: list[Explorer] = [build_explorer(cfg, i, session, weights, self._teacher)
                                           for i in range(cfg.runtime.num_explorers)]
        self._evaluator: Explorer | None = None
        self._results: list[EvalResult] = []
        self._next = 0  # the explorer whose turn it is
        self._budget = 0  # env steps owed (negative: steps taken ahead)
        self.env_steps = 0
        self._broken = False  # a poll raised half-way through a round: no consistent state to checkpoint
        self._replayable = True  # every env instance so far replays deterministically (Env.replayable)

    def poll(self, timeout: float) -> list[Rollout]:
        """Advance the env instances by ``env_steps_per_update`` steps; return the rollouts that ended."""
        self._budget += self.cfg.runtime.lockstep.env_steps_per_update
        self.producer_intervals += 1
        out: list[Rollout] = []
        try:
            while self._budget > 0:
                rollouts, steps = self._explorers[self._next].step_round()
                out.extend(rollouts)
                self._budget -= steps
                self.env_steps += steps
                self._next = (self._next + 1) % len(self._explorers)
                fault_point("poll")
        except BaseException:
            self._broken = True
            raise
        self._replayable = self._replayable and all(e.replayable() for e in self._explorers)
        return out

    def check_alive(self) -> None:
        """Explorers here fail by raising in :meth:`poll`."""

    def publish(self, handle: WeightHandle) -> None:
        self._latest = handle
        for explorer in self._explorers:
            explorer.set_weights(handle)  # loaded at each slot's next episode (its step limit follows at once)

    def request_eval(self, update: int, handle: WeightHandle, counters: dict[str, float]) -> None:
        if self._evaluator is None:
            self._evaluator = build_explorer(self.cfg, 999, self._session, handle, None, evaluation=True)
        self._evaluator.set_weights(handle)
        fault_point("eval")
        self._results.append(EvalResult(update, counters, self._evaluator.evaluate(
            num_tasks=self.cfg.eval.tasks, **self.cfg.eval.sampling(self.cfg.seed))))

    def eval_results(self, timeout: float) -> list[EvalResult]:
        out, self._results = self._results, []
        return out

    def evals_pending(self) -> bool:
        return bool(self._results)

    def shutdown(self, interrupted: bool) -> list[Rollout]:
        for explorer in self._explorers:
            explorer.close()
        return []

    def close(self, interrupted: bool) -> dict[str, Any]:
        if self._evaluator is not None:
            self._evaluator.close()
        close_backend(self._explorers[0].teacher)  # a vLLM teacher engine (shared by every explorer) shuts down
        return {"env_steps": self.env_steps}

    def state_dict(self, weights_dir: Path) -> dict[str, Any] | None:
        """The runtime's state as JSON (older student weights written once per version to ``weights_dir``); ``None``
        when a student lives in vLLM, an env does not replay, or a poll failed half-way."""
        if self._broken or not self._replayable or self._results or any(e.student is None for e in self._explorers):
            return None
        explorers = []
        for explorer in self._explorers:
            state = explorer.state_dict()
            if explorer.policy_version != self._latest.version:
                name = f"explorer-v{explorer.policy_version:06d}.safetensors"
                if not (weights_dir / name).is_file():  # a version's weights never change: written once
                    save_student(explorer.student, weights_dir / name)
                state["weights_file"] = name
            explorers.append(state)
        return {"format": STATE_FORMAT, "session": self._session, "weights_version": int(self._latest.version),
                "next": self._next, "budget": self._budget, "env_steps": self.env_steps,
                "polls": self.producer_intervals, "explorers": explorers}

    def load_state_dict(self, state: dict[str, Any], weights_dir: Path) -> None:
        """Put this runtime, built on the checkpoint's weights, in ``state``. An env that cannot replay raises
        :class:`~divopd.explore.replay.ReplayError`, leaving fresh explorers (:mod:`divopd.train.resume`)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"lockstep runtime state format {state.get('format')!r}, expected {STATE_FORMAT}")
        if len(state["explorers"]) != len(self._explorers) or int(state["weights_version"]) != self._latest.version:
            raise ValueError(f"the checkpoint's lockstep state has {len(state['explorers'])} explorers at weights "
                             f"version {state['weights_version']}; this run has {len(self._explorers)} at "
                             f"{self._latest.version}")
        fresh_session = self._session
        self._session = int(state["session"])
        self._next, self._budget = int(state["next"]), int(state["budget"])
        self.env_steps, self.producer_intervals = int(state["env_steps"]), int(state["polls"])
        try:
            for explorer, saved in zip(self._explorers, state["explorers"], strict=True):
                name = saved.get("weights_file")
                explorer.load_state_dict(saved, self._latest, None if name is None else weights_dir / name)
        except ReplayError:  # an env that cannot replay: fresh explorers in a fresh session (the caller resumes so)
            for explorer in self._explorers:
                explorer.close()
            self._session, self._next, self._budget = fresh_session, 0, 0
            self._explorers = [build_explorer(self.cfg, i, fresh_session, self._latest, self._teacher)
                               for i in range(self.cfg.runtime.num_explorers)]
            raise


@contextmanager
def deterministic_torch() -> Iterator[None]:
    """One torch thread and deterministic algorithms while a lockstep run trains (restored afterwards)."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
