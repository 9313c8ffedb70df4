"""ALFWorld (Shridhar et al., 2020) through the real ``alfworld`` package, and plain TextWorld game files. The
package and its data are optional: :class:`AlfWorldEnv` fails at construction with one line naming what is missing.

+R rules: an action is *invalid* when it is not among the admissible commands of the state it was taken in (where the
game lists them), or the game answers ``"Nothing happens."``; the *allowed actions* are the admissible commands (a game
that lists none falls back to the observation).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from divopd.explore.envs.base import Env, EnvCrash, EnvSetupError, StepResult, action_in

__all__ = ["ALFWORLD_SPLITS", "ALFWORLD_TASK_TYPES", "AlfWorldEnv", "AlfWorldSetupError", "TextWorldGamesEnv",
           "alfworld_games", "alfworld_progress"]

#: divopd split name (and ALFWorld's own) -> ALFWorld data folder
ALFWORLD_SPLITS: dict[str, str] = {"train": "train", "dev": "valid_seen", "valid_seen": "valid_seen",
                                   "test": "valid_unseen", "valid_unseen": "valid_unseen"}
#: the six ALFWorld task types (the package's TASK_TYPES)
ALFWORLD_TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep", "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep", "pick_two_obj_and_place",
)
NOTHING_HAPPENS = "Nothing happens."
log = logging.getLogger(__name__)

_SETUP_HELP = (
    "ALFWorld needs its game files: install the extra with `pip install 'divopd[alfworld]'`, run `alfworld-download` "
    "(it fetches json_2.1.1 and the PDDL/grammar files from the ALFWorld GitHub releases; it needs internet access, "
    "so on an offline machine copy the folder from one that has it), then `export ALFWORLD_DATA=/path/to/that/folder` "
    "(alfworld-download's default is ~/.cache/alfworld) or pass data_dir=."
)


class AlfWorldSetupError(EnvSetupError):
    """ALFWorld cannot start: the data folder or the package is missing."""


def alfworld_progress(observation: str, seen: set[str], won: bool) -> bool:
    """Whether an ALFWorld step made progress: the game was won, or the observation is new in this episode and is not
    "Nothing happens." (ALFWorld has no intermediate score)."""
    text = observation.strip()
    return won or (text != NOTHING_HAPPENS and text not in seen)


def alfworld_games(data_dir: str | os.PathLike, split: str, task_types: Sequence[str] = ALFWORLD_TASK_TYPES,
                   json_dir: str = "json_2.1.1") -> list[str]:
    """Task ids (``<split folder>/<task>/<trial>``, sorted) of the playable games of ``split`` under ``data_dir``,
    filtered as the ``alfworld`` package does (``task_types``, solvable, no ``movable``/``Sliced`` trajectories)."""
    if split not in ALFWORLD_SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; known: {', '.join(ALFWORLD_SPLITS)}")
    root = Path(data_dir) / json_dir
    split_dir = root / ALFWORLD_SPLITS[split]
    if not split_dir.is_dir():
        raise AlfWorldSetupError(f"ALFWorld split folder {split_dir} does not exist. {_SETUP_HELP}")
    unknown = set(task_types) - set(ALFWORLD_TASK_TYPES)
    if unknown:
        raise ValueError(f"unknown ALFWorld task types {sorted(unknown)}; known: {', '.join(ALFWORLD_TASK_TYPES)}")
    tasks = []
    for traj in sorted(split_dir.rglob("traj_data.json")):
        game_dir = traj.parent
        rel = game_dir.relative_to(root).as_posix()
        if "movable" in rel or "Sliced" in rel:
            continue
        game_file = game_dir / "game.tw-pddl"
        if not game_file.is_file():
            continue
        try:
            task_type = json.loads(traj.read_text())["task_type"]
            solvable = bool(json.loads(game_file.read_text()).get("solvable", False))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable trajectory or game file: not playable, as in the package
        if task_type in task_types and solvable:
            tasks.append(rel)
    return tasks


class TextWorldGamesEnv(Env):
    """TextWorld game files (e.g. made with ``tw-make``) played through ``textworld.start``, without the ALFRED
    wrappers. ``games``: game files or folders holding them; tasks are the file paths, every split lists every game
    unless ``splits`` maps split names to path lists."""

    name = "textworld"
    _GAME_SUFFIXES = (".z8", ".ulx", ".tw-pddl")
    _PLAN_KEYS: tuple[str, ...] = ("extra.walkthrough", "policy_commands")  # the gold plan in the expert's state

    def __init__(self, games: Sequence[str | os.PathLike] = (), splits: dict[str, Sequence[str]] | None = None) -> None:
        self._textworld = _import_textworld()
        files: list[str] = []
        for g in games:
            p = Path(g)
            if p.is_dir():
                files += sorted(str(f) for f in p.rglob("*") if f.suffix in self._GAME_SUFFIXES)
            elif p.is_file():
                files.append(str(p))
            else:
                raise FileNotFoundError(f"TextWorld game {p} does not exist")
        self._splits = {k: [str(x) for x in v] for k, v in (splits or {}).items()}
        self._games = files
        self._env: Any = None
        self._seen: set[str] = set()
        self._won = False

    def tasks(self, split: str) -> list[str]:
        if self._splits:
            if split not in self._splits:
                raise ValueError(f"unknown split {split!r}; known: {', '.join(self._splits)}")
            return list(self._splits[split])
        return list(self._games)

    def reset(self, task: str) -> str:
        self._close_game()
        game_file = self._game_file(task)
        try:
            self._env = self._start(game_file, expert=False)
            state = self._env.reset()
        except Exception as e:  # the game engine failed to start: the instance is unusable
            raise EnvCrash(f"TextWorld could not start {game_file}: {type(e).__name__}: {e}") from e
        self._state = state
        obs = str(state["feedback"])
        self._seen, self._won = {obs.strip()}, False
        return obs

    def step(self, action: str) -> StepResult:
        if self._env is None:
            raise RuntimeError("step() before reset()")
        admissible = self.valid_actions()
        try:
            state, _score, done = self._env.step(str(action))
        except Exception as e:
            raise EnvCrash(f"TextWorld step {action!r} failed: {type(e).__name__}: {e}") from e
        self._state = state
        obs = str(state["feedback"])
        won = bool(state.get("won") or False)
        progress = alfworld_progress(obs, self._seen, won and not self._won)
        self._seen.add(obs.strip())
        self._won = self._won or won
        invalid = obs.strip() == NOTHING_HAPPENS or (admissible is not None and not action_in(action, admissible))
        info = {"success": self._won, "progress": progress, "score": 1.0 if self._won else 0.0, "invalid": invalid}
        return obs, 1.0 if won else 0.0, bool(done or won), info

    def valid_actions(self) -> list[str] | None:
        if self._env is None:
            return None
        commands = self._state.get("admissible_commands")
        return list(commands) if commands else None

    def gold_actions(self, task: str) -> list[str] | None:
        """The games' walkthrough (ALFWorld: the package's planner expert plan); ``None`` when there is none."""
        try:
            env = self._start(self._game_file(task), expert=True)
            try:
                state = env.reset()
                plan = next((state.get(k) for k in self._PLAN_KEYS if state.get(k)), None)
            finally:
                env.close()
        except Exception as e:
            log.warning("%s: no expert plan for %s: %s: %s", self.name, task, type(e).__name__, e)
            return None
        return list(plan) if plan else None

    def close(self) -> None:
        self._close_game()

    def _game_file(self, task: str) -> str:
        if not Path(task).is_file():
            raise ValueError(f"TextWorld task {task!r} is not a game file")
        return task

    def _start(self, game_file: str, expert: bool) -> Any:
        infos = self._textworld.EnvInfos(won=True, admissible_commands=True, policy_commands=expert,
                                         extras=["walkthrough"] if expert else [])
        return self._textworld.start(game_file, request_infos=infos)

    def _close_game(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            finally:
                self._env = None


class AlfWorldEnv(TextWorldGamesEnv):
    """ALFWorld's TextWorld games (the real ``alfworld`` package) under ``data_dir`` (default ``$ALFWORLD_DATA``),
    ``json_dir`` the trajectory folder there; splits: ``train``, ``dev`` = ``valid_seen``, ``test`` =
    ``valid_unseen``."""

    name = "alfworld"
    _PLAN_KEYS = ("extra.expert_plan",)

    def __init__(self, data_dir: str | os.PathLike | None = None, task_types: Sequence[str] = ALFWORLD_TASK_TYPES,
                 json_dir: str = "json_2.1.1") -> None:
        root = data_dir if data_dir is not None else os.environ.get("ALFWORLD_DATA")
        if not root:
            raise AlfWorldSetupError(f"ALFWORLD_DATA is not set and no data_dir was given. {_SETUP_HELP}")
        self.data_dir = Path(root).expanduser()
        self.json_dir = json_dir
        self.task_types = tuple(task_types)
        missing = [s for s in ("train", "valid_seen", "valid_unseen") if not (self.data_dir / json_dir / s).is_dir()]
        if missing:
            raise AlfWorldSetupError(
                f"ALFWorld data folder {self.data_dir} has no {json_dir}/{{{','.join(missing)}}} "
                f"(ALFWORLD_DATA / data_dir points at the wrong folder, or the download is incomplete). {_SETUP_HELP}"
            )
        super().__init__()
        self._alfred = _import_alfworld_wrappers()
        self._tasks_cache: dict[str, list[str]] = {}

    def tasks(self, split: str) -> list[str]:
        if split not in self._tasks_cache:
            self._tasks_cache[split] = alfworld_games(self.data_dir, split, self.task_types, self.json_dir)
        return list(self._tasks_cache[split])

    def _game_file(self, task: str) -> str:
        path = self.data_dir / self.json_dir / task / "game.tw-pddl"
        if not path.is_file():
            raise ValueError(f"ALFWorld task {task!r} has no game file at {path}")
        return str(path)

    def _start(self, game_file: str, expert: bool) -> Any:
        demangler, infos_wrapper, expert_cls, expert_type = self._alfred
        wrappers = [demangler(shuffle=False), infos_wrapper]
        if expert:
            wrappers.append(expert_cls(expert_type=expert_type.PLANNER))
        infos = self._textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        return self._textworld.start(game_file, request_infos=infos, wrappers=wrappers)


def _import_textworld() -> Any:
    try:
        import textworld
    except ImportError as e:
        raise AlfWorldSetupError(f"the `textworld` package is not installed ({e}); `pip install 'divopd[alfworld]'` "
                                 "installs it with `alfworld`") from None
    return textworld


def _import_alfworld_wrappers() -> tuple[Any, Any, Any, Any]:
    try:
        from alfworld.agents.environment.alfred_tw_env import (
            AlfredDemangler,
            AlfredExpert,
            AlfredExpertType,
            AlfredInfos,
        )
    except ImportError as e:
        raise AlfWorldSetupError(f"the `alfworld` package is not installed ({e}). {_SETUP_HELP}") from None
    return AlfredDemangler, AlfredInfos, AlfredExpert, AlfredExpertType
