"""Tasks and env instances of an explorer: the training task order (``explorer.task_order``) and env start /
reset / replacement with retries (an :class:`EnvCrash` is counted, logged and retried, never silent)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from divopd.explore.envs import Env, EnvCrash

__all__ = ["task_stream", "start_env", "close_quietly", "reset_with_retries"]

log = logging.getLogger("divopd.explore.explorer")


def task_stream(tasks: Sequence[str], order: str, rng: random.Random, offset: int = 0) -> Iterator[str]:
    """Endless training tasks: ``shuffle`` = a fresh ``rng`` permutation every pass; ``cycle`` = ``tasks`` in their own
    order over and over, starting ``offset`` tasks in (explorer ``i`` passes ``i``, so explorers start apart)."""
    if not tasks:
        raise ValueError("task_stream: no tasks")
    if order == "cycle":
        start = offset % len(tasks)
        while True:
            yield from tasks[start:]
            yield from tasks[:start]
    if order != "shuffle":
        raise ValueError(f"task_stream: order must be 'shuffle' or 'cycle', got {order!r}")
    while True:
        shuffled = list(tasks)
        rng.shuffle(shuffled)
        yield from shuffled


def start_env(factory: Callable[[], Env], attempts: int, who: str, env_name: str) -> Env:
    """A new env instance from ``factory``, retried on :class:`EnvCrash` up to ``attempts`` times."""
    for attempt in range(attempts):
        try:
            return factory()
        except EnvCrash as exc:
            log.warning("%s: env start failed (%s), attempt %d", who.lower(), exc, attempt + 1)
    raise RuntimeError(f"{who}: could not start env {env_name!r} in {attempts} attempts")


def close_quietly(env: Env, who: str) -> None:
    """Close a crashed env; a failure to close is logged, not raised (the caller replaces it anyway)."""
    try:
        env.close()
    except Exception as exc:
        log.warning("%s: closing a crashed env failed: %s", who, exc)


def reset_with_retries(envs: list[Env], i: int, task: str, replace: Callable[[Env], Env], restarts: int,
                       stats: dict[str, Any], who: str, env_name: str) -> str:
    """``envs[i].reset(task)``; on a crash the instance is replaced (``replace``) and the reset retried, at most
    ``restarts`` times (each crash counted in ``stats["env_crashes"]``). Returns the first observation."""
    for attempt in range(restarts + 1):
        try:
            return envs[i].reset(task)
        except EnvCrash as exc:
            stats["env_crashes"] += 1
            log.warning("%s: env crashed on reset of %s (%s)", who.lower(), task, exc)
            if attempt == restarts:
                raise RuntimeError(f"{who}: env {env_name!r} crashed on {attempt + 1} consecutive starts; "
                                   f"last error: {exc}") from exc
            envs[i] = replace(envs[i])
    raise AssertionError("unreachable")
