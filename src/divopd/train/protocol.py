"""What a runtime gives the one loop (:class:`Runtime`); the loop and the trainer see only this."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from divopd.errors import UsageError
from divopd.explore.explorer import Rollout
from divopd.learn.checkpoint import WeightHandle

__all__ = ["EvalResult", "Runtime", "StatelessRuntime"]


@dataclass
class EvalResult:
    """One finished evaluation: the snapshot's update, its learner counters and the eval metrics."""

    update: int
    counters: dict[str, float]
    results: dict[str, float]


class Runtime(Protocol):
    """Every method is called from the loop's thread; ``poll`` and ``eval_results`` return by their ``timeout``."""

    #: ``request_eval`` returns with the result ready (recorded at once, before the update's checkpoint)
    evaluates_in_place: bool
    #: :meth:`state_dict` / :meth:`load_state_dict` carry the runtime's own state across a resume (lockstep)
    keeps_state: bool

    @property
    def producer_intervals(self) -> int | None:
        """Learner-step intervals of production so far (``queue/producer_load``), ``None`` when not paced so."""

    def poll(self, timeout: float) -> list[Rollout]:
        """Finished rollouts not taken yet; waits up to ``timeout`` seconds for the first one."""

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` when no explorer is left to produce rollouts."""

    def publish(self, handle: WeightHandle) -> None:
        """Make ``handle`` the weights every explorer loads before its next rollout."""

    def request_eval(self, update: int, handle: WeightHandle, counters: dict[str, float]) -> None:
        """Start evaluating the snapshot ``handle`` of learner ``update`` (results arrive in request order)."""

    def eval_results(self, timeout: float) -> list[EvalResult]:
        """Evaluations finished so far; waits up to ``timeout`` seconds for one."""

    def evals_pending(self) -> bool:
        """Whether a requested evaluation may still arrive (False once the evaluator has failed)."""

    def state_dict(self, weights_dir: Path) -> dict[str, Any] | None:
        """The runtime's state for a checkpoint (explorer weights it names go into ``weights_dir``); ``None``: none."""

    def load_state_dict(self, state: dict[str, Any], weights_dir: Path) -> None:
        """Put a :meth:`state_dict` back into a runtime built on the checkpoint's weights."""

    def shutdown(self, interrupted: bool) -> list[Rollout]:
        """Stop the explorers; return the rollouts that finished but were not polled."""

    def close(self, interrupted: bool) -> dict[str, Any]:
        """Release the evaluator and everything else; return the runtime's summary fields."""


class StatelessRuntime:
    """The :class:`Runtime` members of a runtime without state, background evaluation or pacing (threads, Ray)."""

    evaluates_in_place = False
    keeps_state = False
    producer_intervals: int | None = None

    def state_dict(self, weights_dir: Path) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any], weights_dir: Path) -> None:
        raise UsageError(f"{type(self).__name__} keeps no runtime state to restore")
