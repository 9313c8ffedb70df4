"""A tiny pure-Python text game for fast explorer tests (no JVM, thousands of steps per second).

+R rules: an action is *invalid* when it is not in :meth:`TinyEnv.valid_actions` of the state it was taken in (or the
game refuses it); the *allowed actions* are that list.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from divopd.explore.envs.base import SPLITS, Env, EnvCrash, ProgressTracker, StepResult, action_in

__all__ = ["TinyEnv", "build_tiny_pair", "env_corpus", "tiny_corpus"]

_SPLIT_OFFSET = {"train": 0, "dev": 100_000, "test": 200_000}
_REFUSALS = ("You cannot go that way.", "There is no coin here.", "Unknown action: I'm not sure what you mean.")
_FILLER = "the walls are plain and the floor is dusty".split()


class TinyEnv(Env):
    """Corridor-and-coin game: ``num_rooms`` rooms in a row, the task names the room that holds the coin, and the
    agent walks there and takes it. Test knobs: ``crash_prob`` makes :meth:`step` raise :class:`EnvCrash` at random
    (seeded), ``filler_words`` lengthens every observation."""

    name = "tiny"

    def __init__(self, num_rooms: int = 5, num_tasks: dict[str, int] | None = None, crash_prob: float = 0.0,
                 filler_words: int = 0, seed: int = 0) -> None:
        if num_rooms < 2:
            raise ValueError(f"TinyEnv: num_rooms must be >= 2, got {num_rooms}")
        if not 0.0 <= crash_prob <= 1.0:
            raise ValueError(f"TinyEnv: crash_prob must be in [0, 1], got {crash_prob}")
        self.num_rooms = num_rooms
        self.num_tasks = {"train": 200, "dev": 50, "test": 50, **(num_tasks or {})}
        self.crash_prob = crash_prob
        self.filler_words = filler_words
        self._crash_rng = random.Random(seed)
        self.replayable = not crash_prob  # the crash RNG belongs to the instance, not to the task
        self._task: str | None = None
        self._room = 0
        self._coin_room = 0
        self._has_coin = False
        self._progress = ProgressTracker()
        self.closed = False

    def tasks(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise ValueError(f"TinyEnv: unknown split {split!r}; expected one of {SPLITS}")
        start = _SPLIT_OFFSET[split]
        return [f"{split}:{start + i}" for i in range(self.num_tasks[split])]

    def _layout(self, task: str) -> tuple[int, int]:
        try:
            split, seed = task.split(":")
            rng = random.Random(int(seed))
        except ValueError:
            raise ValueError(f"TinyEnv: bad task {task!r}; expected 'split:seed', e.g. 'train:3'") from None
        start, coin = rng.sample(range(self.num_rooms), 2)  # distinct rooms
        return start, coin

    def reset(self, task: str) -> str:
        self._check_open()
        self._task = task
        self._room, self._coin_room = self._layout(task)
        self._has_coin = False
        self._progress.reset(0.0, self._room)
        return f"Your task is to take the coin in room {self._coin_room}.\n{self._look()}"

    def step(self, action: str) -> StepResult:
        self._check_open()
        if self._task is None:
            raise RuntimeError("TinyEnv.step called before reset")
        if self.crash_prob and self._crash_rng.random() < self.crash_prob:
            raise EnvCrash("TinyEnv: simulated crash")
        listed = action_in(action, self.valid_actions())
        action = action.strip().lower()
        reward = 0.0
        if action == "move east" and self._room < self.num_rooms - 1:
            self._room += 1
            obs = self._look()
        elif action == "move west" and self._room > 0:
            self._room -= 1
            obs = self._look()
        elif action in ("move east", "move west"):
            obs = "You cannot go that way."
        elif action == "take coin" and self._room == self._coin_room and not self._has_coin:
            self._has_coin = True
            reward = 1.0
            obs = "You take the coin."
        elif action == "take coin":
            obs = "There is no coin here."
        elif action == "look around":
            obs = self._look()
        else:
            obs = "Unknown action: I'm not sure what you mean."
        invalid = not listed or obs in _REFUSALS
        score = 1.0 if self._has_coin else 0.0
        progress = self._progress.update(score, self._room)
        info = {"success": self._has_coin, "progress": progress, "score": score, "invalid": invalid}
        return obs, reward, self._has_coin, info

    def gold_actions(self, task: str) -> list[str]:
        start, coin = self._layout(task)
        direction = "move east" if coin > start else "move west"
        return [direction] * abs(coin - start) + ["take coin"]

    def valid_actions(self) -> list[str]:
        actions = ["look around"]
        if self._room > 0:
            actions.append("move west")
        if self._room < self.num_rooms - 1:
            actions.append("move east")
        if self._room == self._coin_room and not self._has_coin:
            actions.append("take coin")
        return actions

    def close(self) -> None:
        self.closed = True

    def _look(self) -> str:
        text = f"You are in room {self._room}."
        if self._room == self._coin_room and not self._has_coin:
            text += " There is a coin here."
        if self.filler_words:
            text += " " + " ".join(_FILLER[i % len(_FILLER)] for i in range(self.filler_words)) + "."
        return text

    def _check_open(self) -> None:
        if self.closed:
            raise EnvCrash("TinyEnv: used after close()")


def tiny_corpus(num_tasks: int = 30) -> list[str]:
    """Text of the tiny env (its vocabulary, the observations and gold actions of the first ``num_tasks`` train
    tasks) to build a tokenizer for tiny models that can play it."""
    env = TinyEnv()
    texts = ["You are an agent. Valid actions: move east west take coin"]
    for task in env.tasks("train")[:num_tasks]:
        texts.append(env.reset(task))
        for action in env.gold_actions(task):
            texts += [action, env.step(action)[0]]
    return texts


def env_corpus(env_name: str, env_kwargs: dict[str, Any], episodes: int = 6, steps: int = 6) -> list[str]:
    """Text of any registered env for a tiny tokenizer: the prompt's fixed text, then ``episodes`` train episodes of
    at most ``steps`` steps cycling through the listed valid actions (observations and action lists)."""
    from divopd.explore.envs import make_env
    from divopd.explore.prompting import DEFAULT_SYSTEM, PromptConfig

    env = make_env(env_name, **env_kwargs)
    texts = [DEFAULT_SYSTEM, PromptConfig().valid_actions_prefix]
    try:
        for task in env.tasks("train")[:episodes]:
            texts.append(env.reset(task))
            for j in range(steps):
                valid = env.valid_actions() or ["look around"]
                texts.append(", ".join(valid))
                obs, _, done, _ = env.step(valid[j % len(valid)])
                texts.append(obs)
                if done:
                    break
    finally:
        env.close()
    return texts


def build_tiny_pair(out: Path, size: str = "0.2m", texts: list[str] | None = None) -> dict[str, str]:
    """A random-init student (seed 0) and teacher (seed 1) sharing a word-level tokenizer built from ``texts``
    (default :func:`tiny_corpus`), saved under ``out/{student,teacher}``; returns their paths."""
    from divopd.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer(tiny_corpus() if texts is None else texts)
    paths = {}
    for name, seed in (("student", 0), ("teacher", 1)):
        build_model(tok, size=size, seed=seed).save_pretrained(Path(out) / name)
        tok.save_pretrained(Path(out) / name)
        paths[name] = str(Path(out) / name)
    return paths
