"""The environment protocol every explorer talks to (:class:`Env`), and the rules adapters share."""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterable
from typing import Any

__all__ = ["SPLITS", "Env", "EnvCrash", "EnvSetupError", "ProgressTracker", "StepResult", "action_in"]

SPLITS: tuple[str, ...] = ("train", "dev", "test")

StepResult = tuple[str, float, bool, dict[str, Any]]


class EnvCrash(RuntimeError):
    """The environment's backend failed (a dead JVM, a failed HTTP call, a call past its deadline), not a bad action:
    the rollout ends and the instance is replaced. Adapters raise no other type for a backend error."""


class EnvSetupError(RuntimeError):
    """The environment cannot start on this machine: its package or its data is missing. The message is one line that
    names what to install or set (the extra, the download command, the variable)."""


def action_in(action: str, actions: Iterable[str]) -> bool:
    """Whether ``action`` is one of ``actions``, compared stripped, in lower case, with single spaces."""
    norm = " ".join(str(action).lower().split())
    return any(norm == " ".join(str(a).lower().split()) for a in actions)


class ProgressTracker:
    """The ``info["progress"]`` rule shared by the adapters: a step made progress when the score rose above its best so
    far in the episode, or the agent reached a state (e.g. location + inventory) not seen before in the episode."""

    def __init__(self) -> None:
        self.best_score = float("-inf")
        self.seen: set[object] = set()

    def reset(self, score: float, state: object) -> None:
        """Start an episode at ``score`` in ``state``."""
        self.best_score = float(score)
        self.seen = {state}

    def update(self, score: float, state: object) -> bool:
        """Record one step; returns whether it made progress."""
        progressed = score > self.best_score or state not in self.seen
        self.best_score = max(self.best_score, float(score))
        self.seen.add(state)
        return progressed


class Env(abc.ABC):
    """One text-environment instance: implement :meth:`tasks`, :meth:`reset` and :meth:`step`; the rest is optional.

    :meth:`step`'s ``info`` holds at least ``success`` (bool), ``progress`` (bool, :class:`ProgressTracker`'s rule),
    ``score`` (float, in [0, 1] where the env has one) and ``invalid`` (bool, by the env's rule, stated in its class
    docstring; +R counts it as a no-progress turn). A bad action answers with the env's feedback, never an exception;
    a crashed backend raises :class:`EnvCrash` from :meth:`reset` or :meth:`step` only. The explorer owns the step
    limit. ``name`` is recorded in ``Turn.info["env"]``; ``replayable``: the same task and actions give the same
    observations, which an exact lockstep resume needs (False where the instance carries randomness of its own).
    """

    name: str = "env"
    replayable: bool = True

    @abc.abstractmethod
    def tasks(self, split: str) -> list[str]:
        """Task ids of ``split`` (``"train"``, ``"dev"`` or ``"test"``)."""

    @abc.abstractmethod
    def reset(self, task: str) -> str:
        """Start ``task``; returns the first observation (task description included)."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply ``action``; returns ``(observation, reward, done, info)``."""

    def gold_actions(self, task: str) -> list[str] | None:
        """An expert action sequence that solves ``task``, where the environment has one. May restart the instance on
        ``task``: call it before :meth:`reset`, not mid-episode."""
        return None

    def valid_actions(self) -> list[str] | None:
        """Currently valid actions, where the environment lists them (for prompts)."""
        return None

    def allowed_actions_key(self) -> Hashable | None:
        """The set of currently allowed actions as a hashable key, for the +R rule "a repeated action while the set of
        allowed actions is unchanged": by default the frozenset of :meth:`valid_actions` (``None`` where the env lists
        none: the explorer then uses the observation text)."""
        actions = self.valid_actions()
        return None if actions is None else frozenset(" ".join(str(a).lower().split()) for a in actions)

    def close(self) -> None:
        """Release the environment's resources (e.g. its JVM)."""
        return None

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
