"""ScienceWorld adapter (``pip install scienceworld``; Java 17, offline; one JVM per instance). Tasks are
``"<task-name>:<variation>"``; steps call the server directly, never building the package's list of valid
action/object combinations (thousands of strings).

+R rules: an action is *invalid* when the simulator's parser refuses it ("No known action matches that input." or
its "Ambiguous request" prompt: no action was taken); an action that parses but fails in the world ("The door is not
open.") is not. The *allowed actions* (:meth:`ScienceWorldEnv.allowed_actions_key`) stand in for the package's
combinations, which are those of the visible objects: the room's look text and the inventory after the step.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from typing import ClassVar

from divopd.explore.envs._jvm import DEFAULT_CALL_TIMEOUT_S, NO_STEP_LIMIT, JvmEnv, check_call_timeout, read_timeout_for
from divopd.explore.envs._jvm_hosts import own_package_env
from divopd.explore.envs.base import SPLITS, ProgressTracker, StepResult

__all__ = ["PAPER_HELD_OUT_TYPES", "PAPER_TRAIN_TYPES", "SPLIT_SCHEMES", "ScienceWorldEnv", "scienceworld_paper_split",
           "variation_counts"]

#: the parser's answers when it took no action
_REFUSALS = ("No known action matches that input.", "Ambiguous request")

#: The paper's 17 training task types (Appendix Table 6; mendelian-genetics-known-plant placed here, see MACHINE-NOTES).
PAPER_TRAIN_TYPES: tuple[str, ...] = (
    "boil", "melt", "change-the-state-of-matter-of", "use-thermometer", "measure-melting-point-known-substance",
    "power-component", "test-conductivity", "find-living-thing", "find-plant", "grow-plant", "chemistry-mix",
    "chemistry-mix-paint-secondary-color", "lifespan-shortest-lived", "identify-life-stages-2",
    "inclined-plane-determine-angle", "inclined-plane-friction-named-surfaces", "mendelian-genetics-known-plant",
)
#: The paper's 13 held-out task types, disjoint from :data:`PAPER_TRAIN_TYPES`; together they are all 30 tasks.
PAPER_HELD_OUT_TYPES: tuple[str, ...] = (
    "freeze", "measure-melting-point-unknown-substance", "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity-of-unknown-substances", "find-non-living-thing", "find-animal", "grow-fruit",
    "chemistry-mix-paint-tertiary-color", "lifespan-longest-lived", "lifespan-longest-lived-then-shortest-lived",
    "identify-life-stages-1", "inclined-plane-friction-unnamed-surfaces", "mendelian-genetics-unknown-plant",
)
#: ``split_scheme`` values of :class:`ScienceWorldEnv`.
SPLIT_SCHEMES: tuple[str, ...] = ("package", "paper")

_VARIATION_COUNTS: dict[str, int] = {}  # task name -> official variation count, filled once per process


def variation_counts(env: ScienceWorldEnv | None = None) -> dict[str, int]:
    """Every task's official number of variations in the installed package, from ``env``'s simulator or one JVM
    started for it; cached per process."""
    if not _VARIATION_COUNTS:
        with ScienceWorldEnv() if env is None else contextlib.nullcontext(env) as sim:
            _VARIATION_COUNTS.update({name: int(sim._call(lambda name=name: sim._server.getTaskMaxVariations(name)))
                                      for name in sim._all_names})
    return dict(_VARIATION_COUNTS)


def scienceworld_paper_split(seed: int = 42, env: ScienceWorldEnv | None = None,
                             ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The paper's ScienceWorld split (Appendix Table 6): ``(training, held_out)`` lists of ``(task name, variation)``
    over :data:`PAPER_TRAIN_TYPES` and :data:`PAPER_HELD_OUT_TYPES`. Per type, variation ids ``0 .. N // 2 - 1``
    (:func:`variation_counts`), listed type by type, then each list shuffled with a fresh ``random.Random(seed)``.
    ``env``: an open :class:`ScienceWorldEnv` to read the counts from."""
    counts = variation_counts(env)
    missing = sorted(set(PAPER_TRAIN_TYPES + PAPER_HELD_OUT_TYPES) - set(counts))
    if missing:
        raise ValueError(f"scienceworld_paper_split: the installed scienceworld package lacks tasks {missing}")
    out = []
    for types in (PAPER_TRAIN_TYPES, PAPER_HELD_OUT_TYPES):
        items = [(name, var) for name in types for var in range(counts[name] // 2)]
        random.Random(seed).shuffle(items)
        out.append(items)
    return out[0], out[1]


class ScienceWorldEnv(JvmEnv):
    """One ScienceWorld simulator (one JVM). ``task_names`` narrows the task types; ``simplifications`` is the
    package's string (e.g. ``"easy"``); ``split_scheme`` ``"paper"`` lists :func:`scienceworld_paper_split`'s training
    and held-out lists (shuffled with ``split_seed``) as ``train`` and ``test``."""

    name = "scienceworld"

    #: (task_name, split) -> variations, shared by every instance of the process (listing needs a load per task)
    _split_cache: ClassVar[dict[tuple[str, str], list[int]]] = {}
    #: (task, simplifications) -> gold actions, shared likewise
    _gold_cache: ClassVar[dict[tuple[str, str], list[str]]] = {}

    def __init__(self, task_names: Sequence[str] | None = None, simplifications: str = "",
                 java_opts_str: str | None = None, split_scheme: str = "package", split_seed: int = 42,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        import scienceworld.scienceworld as package

        if split_scheme not in SPLIT_SCHEMES:
            raise ValueError(f"ScienceWorldEnv: unknown split_scheme {split_scheme!r}; expected one of {SPLIT_SCHEMES}")
        self.call_timeout_s = check_call_timeout("ScienceWorldEnv", call_timeout_s)
        self._env, self._release = own_package_env(package, lambda: package.ScienceWorldEnv(envStepLimit=NO_STEP_LIMIT),
                                                    java_opts_str, read_timeout_for(self.call_timeout_s))
        self._server = self._env.server
        all_names = list(self._call(self._env.get_task_names))
        unknown = sorted(set(task_names or []) - set(all_names))
        if unknown:
            self._release()
            raise ValueError(f"ScienceWorldEnv: unknown task names {unknown}; known: {all_names}")
        self._all_names = all_names
        self.task_names = list(task_names) if task_names else all_names
        self.simplifications = simplifications
        self.split_scheme, self.split_seed = split_scheme, split_seed
        self._task: str | None = None
        self._progress = ProgressTracker()
        self._templates: list[str] | None = None
        self._last_state: tuple[str, str] | None = None
        self._last_score = 0.0

    def tasks(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise ValueError(f"ScienceWorldEnv: unknown split {split!r}; expected one of {SPLITS}")
        if self.split_scheme == "paper":
            return self._paper_tasks(split)
        out = []
        for name in self.task_names:
            key = (name, split)
            if key not in self._split_cache:
                self._call(lambda name=name: self._server.load(name, 0, self.simplifications, False))
                getter = {"train": "getVariationsTrain", "dev": "getVariationsDev", "test": "getVariationsTest"}[split]
                self._split_cache[key] = self._call(lambda g=getter: [int(v) for v in getattr(self._server, g)()])
            out.extend(f"{name}:{v}" for v in self._split_cache[key])
        return out

    def _paper_tasks(self, split: str) -> list[str]:
        if split == "dev":
            raise ValueError("ScienceWorldEnv: split_scheme 'paper' has only 'train' and 'test' (the held-out list); "
                             "set explorer.eval_split: test")
        training, held_out = scienceworld_paper_split(self.split_seed, env=self)
        keep = set(self.task_names)
        return [f"{name}:{var}" for name, var in (training if split == "train" else held_out) if name in keep]

    def _parse(self, task: str) -> tuple[str, int]:
        name, _, var = task.rpartition(":")
        if name not in self.task_names or not var.isdigit():
            raise ValueError(f"ScienceWorldEnv: bad task {task!r}; expected '<task-name>:<variation>' with a task of "
                             f"{self.task_names}")
        max_var = int(self._call(lambda: self._server.getTaskMaxVariations(name)))
        if int(var) >= max_var:
            raise ValueError(f"ScienceWorldEnv: task {task!r}: variation out of range (task has {max_var})")
        return name, int(var)

    def reset(self, task: str) -> str:
        name, var = self._parse(task)
        self._call(lambda: self._server.load(name, var, self.simplifications, False))
        self._task = task
        desc = self._call(lambda: self._server.getTaskDescription())
        # The server's score still holds the previous episode's value until the first step: start from 0.
        self._last_state = self._state()
        self._progress.reset(0.0, self._last_state)
        self._last_score = 0.0
        self.valid_actions()  # fetched here, where a backend error is the explorer's EnvCrash
        return f"{desc.strip()}\n{self._call(lambda: self._server.freeActionLook()).strip()}"

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("ScienceWorldEnv.step called before reset")
        obs = self._call(lambda: self._server.step(action.strip()))
        raw = float(self._call(lambda: self._server.getScore()))
        completed = bool(self._call(lambda: self._server.getCompleted()))
        failure = raw < 0
        score = max(0.0, min(1.0, raw))
        self._last_state = self._state()
        info = {
            "success": completed and raw >= 1.0,
            "progress": self._progress.update(score, self._last_state),
            "score": score,
            "failure": failure,
            "invalid": obs.strip().startswith(_REFUSALS),
        }
        reward, self._last_score = score - self._last_score, score
        return obs.strip(), float(reward), completed or failure, info

    def gold_actions(self, task: str) -> list[str]:
        key = (task, self.simplifications)
        if key not in self._gold_cache:
            name, var = self._parse(task)
            self._call(lambda: self._server.load(name, var, self.simplifications, True))
            self._gold_cache[key] = self._call(lambda: [str(a) for a in self._server.getGoldActionSequence()])
            self._task = None  # the gold load leaves the simulator at the end of the gold path
        return list(self._gold_cache[key])

    def valid_actions(self) -> list[str]:
        """The action templates (``open OBJ``, ``go to LOC``, ...): the full valid list is too long for a prompt."""
        if self._templates is None:
            self._templates = self._call(lambda: sorted(str(a) for a in self._server.getPossibleActions()))
        return list(self._templates)

    def allowed_actions_key(self) -> tuple[str, str] | None:
        """The +R stand-in for the allowed actions: (look text, inventory text) of the current state."""
        return self._last_state

    def _state(self) -> tuple[str, str]:
        return self._call(lambda: (self._server.freeActionLook(), self._server.freeActionInventory()))
