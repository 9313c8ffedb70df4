"""An exact resume of a lockstep run, beside ``Explorer.state_dict``: each running episode replayed on a fresh env
instance (one that does not replay as recorded is refused in one line), and the student copy's weights on disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from divopd.errors import UsageError
from divopd.explore.envs import Env, EnvCrash
from divopd.explore.episode import Episode
from divopd.explore.recovery import allowed_key

__all__ = ["ReplayError", "load_student", "replay_episode", "save_student"]


class ReplayError(UsageError, RuntimeError):
    """An environment gave another observation when its recorded actions were replayed (not deterministic), or
    crashed on every try: the run cannot resume exactly (one line, exit 2)."""


def replay_episode(envs: list[Env], i: int, episode: Episode, replace_env: Callable[[Env], Env],
                   max_restarts: int) -> Episode:
    """Reset env slot ``i`` on the episode's task and replay its actions with the explorer's calls; ``episode`` with
    its +R allowed-set keys from the replayed env. A crash is retried on a fresh instance (``replace_env``)."""
    for attempt in range(max_restarts + 1):
        try:
            keys = _replay(envs[i], episode)
            break
        except EnvCrash as exc:
            if attempt == max_restarts:
                raise ReplayError(f"env {envs[i].name!r} crashed replaying rollout {episode.rollout_id}: {exc}"
                                  ) from exc
            envs[i] = replace_env(envs[i])
    episode.recovery.allowed = keys[-1]
    episode.recovery.last_allowed = keys[-2] if len(keys) > 1 else None
    return episode


def _replay(env: Env, episode: Episode) -> list[Any]:
    """Replay ``episode`` on ``env``; the allowed-set key after the reset and after each step."""
    def check(what: str, got: object, want: object) -> None:
        if got != want:
            raise ReplayError(f"env {env.name!r} is not deterministic under replay: rollout {episode.rollout_id} "
                              f"(task {episode.task!r}) gave another {what} ({str(got)[:80]!r} instead of "
                              f"{str(want)[:80]!r}); this run cannot resume exactly")

    first = env.reset(episode.task)
    check("first observation", first, episode.first_observation)
    valid = env.valid_actions()
    keys = [allowed_key(env.allowed_actions_key(), first)]
    for n, (action, observation) in enumerate(episode.history):
        obs, _, _, _ = env.step(action)
        check(f"observation at step {n}", obs, observation)
        valid = env.valid_actions()
        keys.append(allowed_key(env.allowed_actions_key(), obs))
    check("valid-action list", None if valid is None else list(valid), episode.valid_actions)
    return keys


def save_student(student: Any, path: Path) -> None:
    """Write an explorer's HF student copy's weights to ``path`` (safetensors; temporary name, then rename)."""
    from safetensors.torch import save_model

    if student is None:
        raise ValueError("save_student: the explorer has no HF student copy (a vLLM engine holds its weights)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_model(student, str(tmp))
    tmp.replace(path)


def load_student(student: Any, path: Path) -> None:
    """Load :func:`save_student`'s file into an explorer's student copy."""
    from safetensors.torch import load_model

    if not path.is_file():
        raise FileNotFoundError(f"the weights the explorer's student copy held, {path}, are missing")
    load_model(student, str(path))
