"""The environment protocol every explorer talks to.

An environment is one text game instance. Tasks are plain strings naming a task (and its variation/seed) that
:meth:`Env.tasks` lists per split. Example::

    env = TextWorldExpressEnv(game="coin", params="numLocations=3")
    obs = env.reset(env.tasks("train")[0])
    obs, reward, done, info = env.step("open door to north")
    info["success"], info["progress"], info["score"]
    env.close()

Rules: a bad action returns the environment's own feedback as the observation (never an exception); ``info`` always
holds ``success`` (bool), ``progress`` (bool: this step raised the score or reached a new state / sub-goal),
``score`` (float, the env's running score normalised to [0, 1] where the env has one) and ``invalid`` (bool: the
action was invalid by the adapter's rule, stated in its docstring). An environment crash raises :class:`EnvCrash`; the
explorer ends that rollout (counted) and carries on with a fresh instance. Backend errors (a dead JVM, a failed HTTP
call, a backend call past its deadline) are :class:`EnvCrash`, never another exception type, and they surface from
:meth:`Env.reset` and :meth:`Env.step`: :meth:`Env.valid_actions` and :meth:`Env.allowed_actions_key` answer from what
the last reset/step fetched (the explorer calls them outside its env-crash handler).

+R (:mod:`divopd.explore.recovery`) counts a no-progress turn as an invalid action, or a repeated action while the set
of allowed actions is unchanged: ``info["invalid"]`` is the first, :meth:`Env.allowed_actions_key` names the set.

Splits are named ``"train"``, ``"dev"`` and ``"test"`` (the packages' own folds where they have them). Tasks are
strings such as ``"train:17"`` (TextWorld-Express seed 17 of the train fold) or ``"boil:0"`` (ScienceWorld task
``boil``, variation 0); :meth:`Env.tasks` is the source of truth. The explorer owns the step limit: adapters set the
packages' internal limits high enough never to end an episode first.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterable
from typing import Any

__all__ = ["SPLITS", "Env", "EnvCrash", "EnvSetupError", "ProgressTracker", "StepResult", "action_in"]

SPLITS: tuple[str, ...] = ("train", "dev", "test")

StepResult = tuple[str, float, bool, dict[str, Any]]


class EnvCrash(RuntimeError):
    """The environment process failed (not a bad action): the rollout ends and the instance is replaced."""


class EnvSetupError(RuntimeError):
    """The environment cannot start on this machine: its package or its data is missing. The message is one line that
    names what to install or set (the extra, the download command, the variable)."""


def action_in(action: str, actions: Iterable[str]) -> bool:
    """Whether ``action`` is one of ``actions``, compared stripped, in lower case, with single spaces."""
    norm = " ".join(str(action).lower().split())
    return any(norm == " ".join(str(a).lower().split()) for a in actions)


class ProgressTracker:
    """The ``info["progress"]`` rule shared by the adapters: a step made progress when the score rose above its best so
    far in the episode, or the agent reached a state (e.g. location + inventory) not seen before in the episode.

    Repeating an action that changes nothing, an unknown command, or walking back to a visited room is no progress.
    A diagnostic (``info["progress"]``): the +R trigger counts the paper's rule instead (``info["invalid"]`` and
    :meth:`Env.allowed_actions_key`, see :mod:`divopd.explore.recovery`).
    """

    def __init__(self) -> None:
        self.best_score = float("-inf")
        self.seen: set[object] = set()

    def reset(self, score: float, state: object) -> None:
        """Start an episode at ``score`` in ``state``."""
        self.best_score = float(score)
        self.seen = {state}

    def update(self, score: float, state: object) -> bool:
        """Record one step; returns whether it made progress."""
        progressed = False
        if score > self.best_score:
            self.best_score = float(score)
            progressed = True
        if state not in self.seen:
            self.seen.add(state)
            progressed = True
        return progressed


class Env(abc.ABC):
    """One text-environment instance.

    Subclass it and implement :meth:`tasks`, :meth:`reset` and :meth:`step`; :meth:`valid_actions` (listed in the
    prompt), :meth:`gold_actions` (for ``divopd sft``), :meth:`allowed_actions_key` and :meth:`close` are optional.
    Name the class in a config by its import path, ``explorer.env: mypkg.envs:MyEnv`` (every command that takes an
    environment takes it: ``train``, ``sft --env``, ``eval``, ``bench``).

    The ``info`` dict :meth:`step` returns must hold these keys (more are allowed and ignored):

    - ``success`` (bool): the task is solved; evaluation's success rate counts it.
    - ``progress`` (bool): this step raised the score or reached a state not seen before in the episode (a
      diagnostic; :class:`ProgressTracker` implements the rule).
    - ``score`` (float): the running score, normalised to [0, 1] where the env has one.
    - ``invalid`` (bool): the action was invalid by the env's rule (state it in the class docstring); +R counts it
      as a no-progress turn.

    A bad action answers with the environment's feedback as the observation, never an exception; a crashed backend
    raises :class:`EnvCrash` (the explorer replaces the instance).

    Class attributes:

    - ``name`` (str): a short name, recorded in ``Turn.info["env"]``.
    - ``replayable`` (bool, default True): a :meth:`reset` on a task followed by the same actions gives the same
      observations, whatever the instance did before. A resumed lockstep run rebuilds the episodes that were running at
      its checkpoint by replaying their actions, which is exact only then; set it False where the instance carries
      randomness of its own (such a run then resumes as the threads runtime does: the episodes running at the
      checkpoint start over, and the resume says that it is no longer exact).
    """

    #: short name used in configs and Turn.info["env"]
    name: str = "env"
    #: a reset on a task followed by the same actions gives the same observations, whatever the instance did before
    #: (a lockstep resume rebuilds running episodes so); False where the instance carries randomness of its own
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
        """An expert action sequence that solves ``task``, where the environment has one.

        May restart the instance on ``task`` to compute it: call it before :meth:`reset`, not mid-episode.
        """
        return None

    def valid_actions(self) -> list[str] | None:
        """Currently valid actions, where the environment lists them (for prompts); ``None`` otherwise.

        Answered from what the last :meth:`reset` / :meth:`step` fetched: a backend adapter fetches the list there, so
        that a backend failure is that call's :class:`EnvCrash` (raised here only before any reset)."""
        return None

    def allowed_actions_key(self) -> Hashable | None:
        """The set of currently allowed actions as a hashable key, for the +R rule "a repeated action while the set of
        allowed actions is unchanged": by default the frozenset of :meth:`valid_actions` (``None`` where the env lists
        none: the explorer then uses the observation text). Adapters whose list is not the real set override it."""
        actions = self.valid_actions()
        return None if actions is None else frozenset(" ".join(str(a).lower().split()) for a in actions)

    def close(self) -> None:
        """Release the environment's resources (e.g. its JVM); the default has none to release."""
        return None

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
