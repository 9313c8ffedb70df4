"""The environment protocol every explorer talks to.

An environment is one text game instance. Tasks are plain strings naming a task (and its variation/seed) that
:meth:`Env.tasks` lists per split. Example::

    env = TextWorldExpressEnv(game="coin", params="numLocations=3")
    obs = env.reset(env.tasks("train")[0])
    obs, reward, done, info = env.step("open door to north")
    info["success"], info["progress"], info["score"]
    env.close()

Rules: a bad action returns the environment's own feedback as the observation (never an exception); ``info`` always
holds ``success`` (bool), ``progress`` (bool: this step raised the score or reached a new state / sub-goal) and
``score`` (float, the env's running score normalised to [0, 1] where the env has one). An environment crash raises
:class:`EnvCrash`; the explorer ends that rollout (counted) and carries on with a fresh instance.
"""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["Env", "EnvCrash", "StepResult"]

StepResult = tuple[str, float, bool, dict[str, Any]]


class EnvCrash(RuntimeError):
    """The environment process failed (not a bad action): the rollout ends and the instance is replaced."""


class Env(abc.ABC):
    """One text-environment instance."""

    #: short name used in configs and Turn.info["env"]
    name: str = "env"

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
        """An expert action sequence that solves ``task``, where the environment has one."""
        return None

    def valid_actions(self) -> list[str] | None:
        """Currently valid actions, where the environment lists them (for prompts); ``None`` otherwise."""
        return None

    def close(self) -> None:
        """Release the environment's resources (e.g. its JVM); the default has none to release."""
        return None

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
