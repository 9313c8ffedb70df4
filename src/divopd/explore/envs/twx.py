"""TextWorld-Express adapter (``pip install textworld-express``; offline). Instances share one JVM per process
(``share_jvm=True``), each with its own game object; the JVM ends with the last instance's ``close()``. Tasks are
``"<fold>:<seed>"`` over the package's seed folds; ``dev_from_train=N`` makes the last N train seeds the dev split.

+R rules: an action is *invalid* when it is not among the package's ``validActions`` of the state it was taken in, or
the game answers "Unknown action" / "I'm not sure what you mean"; the *allowed actions* are those ``validActions``.
"""

from __future__ import annotations

from typing import Any

from divopd.explore.envs._jvm import DEFAULT_CALL_TIMEOUT_S, NO_STEP_LIMIT, JvmEnv, check_call_timeout, read_timeout_for
from divopd.explore.envs._jvm_hosts import own_package_env, shared_package_env
from divopd.explore.envs.base import SPLITS, ProgressTracker, StepResult, action_in

__all__ = ["DEFAULT_GAME", "DEFAULT_PARAMS", "TextWorldExpressEnv"]

DEFAULT_GAME = "coin"
DEFAULT_PARAMS = "numLocations=3,numDistractorItems=0,includeDoors=0"
#: the game's own answers to a command it cannot parse or apply
_NOT_UNDERSTOOD = ("unknown action", "i'm not sure what you mean")


class TextWorldExpressEnv(JvmEnv):
    """One TextWorld-Express game instance (a JVM shared by the process's instances, or its own)."""

    name = "twx"

    def __init__(self, game: str = DEFAULT_GAME, params: str = DEFAULT_PARAMS, java_opts_str: str | None = None,
                 dev_from_train: int = 0, share_jvm: bool = True, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S):
        import textworld_express.textworld_express as package
        from textworld_express import TextWorldExpressEnv as _PackageEnv
        from textworld_express.constants import GAME_NAMES

        if game not in GAME_NAMES:
            raise ValueError(f"TextWorldExpressEnv: unknown game {game!r}; expected one of {GAME_NAMES}")
        if isinstance(dev_from_train, bool) or not isinstance(dev_from_train, int) or dev_from_train < 0:
            raise ValueError(f"TextWorldExpressEnv: dev_from_train must be an integer >= 0, got {dev_from_train!r}")
        if not isinstance(share_jvm, bool):
            raise ValueError(f"TextWorldExpressEnv: share_jvm must be true or false, got {share_jvm!r}")
        self.game = game
        self.params = params
        self.dev_from_train = dev_from_train
        self.share_jvm = share_jvm
        self.call_timeout_s = check_call_timeout("TextWorldExpressEnv", call_timeout_s)
        host = shared_package_env if share_jvm else own_package_env  # a shared JVM keeps its first read timeout
        self._env, self._release = host(package, lambda: _PackageEnv(envStepLimit=NO_STEP_LIMIT), java_opts_str,
                                        read_timeout_for(self.call_timeout_s))
        try:
            self._env.load(game, params)  # raises ValueError on a bad params string
        except Exception:
            self._release()
            raise
        self._seeds: dict[str, list[int]] = {}
        self._gold: dict[str, list[str]] = {}
        self._valid: list[str] = []
        self._task: str | None = None
        self._progress = ProgressTracker()

    def tasks(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise ValueError(f"TextWorldExpressEnv: unknown split {split!r}; expected one of {SPLITS}")
        if self.dev_from_train and split != "test":
            train = self._fold_seeds("train")
            cut = len(train) - self.dev_from_train
            if cut < 1:
                raise ValueError(f"TextWorldExpressEnv: dev_from_train={self.dev_from_train} leaves no train task "
                                 f"(the train fold has {len(train)})")
            return [f"train:{s}" for s in (train[:cut] if split == "train" else train[cut:])]
        return [f"{split}:{s}" for s in self._fold_seeds(split)]

    def _fold_seeds(self, fold: str) -> list[int]:
        if fold not in self._seeds:
            getter = {"train": "getSeedsTrain", "dev": "getSeedsDev", "test": "getSeedsTest"}[fold]
            self._seeds[fold] = self._call(lambda: [int(s) for s in getattr(self._env.server, getter)()])
        return self._seeds[fold]

    @staticmethod
    def _parse(task: str) -> tuple[str, int]:
        try:
            fold, seed = task.split(":")
            if fold not in SPLITS:
                raise ValueError
            return fold, int(seed)
        except ValueError:
            raise ValueError(f"TextWorldExpressEnv: bad task {task!r}; expected '<train|dev|test>:<seed>'") from None

    def reset(self, task: str) -> str:
        fold, seed = self._parse(task)
        obs, infos = self._call(lambda: self._env.reset(seed=seed, gameFold=fold, generateGoldPath=True))
        self._task = task
        self._gold[task] = list(self._call(self._env.getGoldActionSequence))
        self._valid = sorted(infos["validActions"])
        self._progress.reset(float(infos["score"]), _state(infos))
        return f"{infos['taskDescription'].strip()}\n{obs.strip()}"

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("TextWorldExpressEnv.step called before reset")
        allowed_before = self._valid
        obs, reward, _, infos = self._call(lambda: self._env.step(action.strip()))
        self._valid = sorted(infos["validActions"])
        invalid = not action_in(action, allowed_before) or any(m in obs.lower() for m in _NOT_UNDERSTOOD)
        score = float(infos["score"])
        success = bool(infos["tasksuccess"])
        done = success or bool(infos["taskfailure"])
        info = {
            "success": success,
            "progress": self._progress.update(score, _state(infos)),
            "score": max(0.0, min(1.0, score)),
            "failure": bool(infos["taskfailure"]),
            "invalid": invalid,
        }
        return obs.strip(), float(reward), done, info

    def gold_actions(self, task: str) -> list[str]:
        if task not in self._gold:
            self.reset(task)
            self._task = None
        return list(self._gold[task])

    def valid_actions(self) -> list[str]:
        return list(self._valid)


def _state(infos: dict[str, Any]) -> tuple[str, str]:
    """The progress rule's state: where the agent is and what it carries."""
    return (infos.get("look", ""), infos.get("inventory", ""))
