"""The explorer's records of a running rollout, as JSON too (a lockstep checkpoint saves them), the finished
:class:`~divopd.experience.turn.Rollout` built from one, and what an explorer counts over them."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from divopd.experience.turn import ResponseScores, Rollout, RolloutInfo, Turn
from divopd.explore.recovery import RecoveryState

if TYPE_CHECKING:
    from divopd.explore.generation import Generation
    from divopd.explore.prompting import EncodedPrompt

__all__ = ["EXPLORER_COUNTERS", "Action", "Actor", "Episode", "StudentStep", "build_rollout", "count_rollout",
           "episode_from_state", "episode_state", "eval_metrics"]

#: An explorer's cumulative counters (``Explorer.stats()``, namespaced ``explorer/...``).
EXPLORER_COUNTERS: tuple[str, ...] = (
    "rollouts", "turns", "teacher_turns", "takeovers", "successes", "env_steps", "env_crashes", "teacher_failures",
    "unscored_turns", "teacher_masked_tokens", "truncated_turns", "weight_loads", "step_limit_hits",
    "generated_tokens", "time/generate", "time/env", "time/teacher_score", "time/weight_load_s")


Actor = Literal["student", "teacher"]


@dataclass(frozen=True)
class Action:
    """One env slot's move in a round: who acted, the prompt it saw, its generation and the action text decoded."""

    actor: Actor
    prompt: EncodedPrompt
    generation: Generation
    text: str


@dataclass
class StudentStep:
    """A student turn while its rollout is running (becomes a Turn once the teacher has scored it)."""

    step: int
    prompt_ids: list[int]
    prompt_truncated: bool
    response_ids: list[int]
    logprobs: np.ndarray
    policy_version: int
    action: str
    reward: float = 0.0
    progress: bool = False
    score: float = 0.0


@dataclass
class Episode:
    """One running rollout on one env slot."""

    rollout_id: str
    task: str
    first_observation: str
    valid_actions: list[str] | None
    history: list[tuple[str, str]] = field(default_factory=list)
    student_steps: list[StudentStep] = field(default_factory=list)
    recovery: RecoveryState = field(default_factory=RecoveryState)
    steps: int = 0
    score: float = 0.0
    success: bool = False
    done: bool = False
    crashed: bool = False
    queued: int = 0  # student steps already turned into queued Turns (explorer.enqueue: turn)
    unscored: int = 0  # of those, how many the teacher could not score


def build_rollout(episode: Episode, scores: Sequence[ResponseScores | None], *, explorer_id: int, env: str,
                  max_steps: int, policy_version: int, truncated_dead: bool = True, start: int = 0) -> Rollout:
    """The rollout's Turns and info from an episode and the teacher's scores of its student turns ``start:``
    (``None``: unscored). ``truncated_dead``: a truncated prompt's turn gets an all-False teacher-valid mask. An
    episode still running gives a *chunk* (``enqueue: turn``): ``info.partial``, and its turns' outcome keys None."""
    steps = episode.student_steps[start:]
    hit_limit = not episode.crashed and not episode.success and episode.steps >= max_steps
    versions = [s.policy_version for s in episode.student_steps] or [policy_version]
    info = RolloutInfo(
        rollout_id=episode.rollout_id, explorer_id=explorer_id, env=env, task=episode.task, success=episode.success,
        score=episode.score, horizon=episode.steps, student_turns=len(episode.student_steps),
        teacher_turns=episode.recovery.teacher_turns, takeovers=episode.recovery.takeovers, crashed=episode.crashed,
        hit_step_limit=hit_limit, truncated_turns=sum(s.prompt_truncated for s in episode.student_steps),
        unscored_turns=episode.unscored + sum(s is None for s in scores), policy_version_min=min(versions),
        policy_version_max=max(versions), partial=not episode.done)
    known = episode.done
    turns = [Turn(
        rollout_id=episode.rollout_id, turn_index=s.step, policy_version=s.policy_version,
        prompt_ids=s.prompt_ids, response_ids=s.response_ids, student_logprobs=s.logprobs,
        teacher_logprobs=None if sc is None else sc.logprobs, prompt_truncated=s.prompt_truncated,
        teacher_valid_mask=np.zeros(len(s.response_ids), dtype=bool) if truncated_dead and s.prompt_truncated else None,
        teacher_topk_ids=None if sc is None else sc.topk_ids,
        teacher_topk_logprobs=None if sc is None else sc.topk_logprobs,
        info={"env": env, "task": episode.task, "action": s.action, "reward": s.reward, "progress": s.progress,
              "score": s.score, "success": episode.success if known else None,
              "rollout_score": episode.score if known else None, "horizon": episode.steps if known else None,
              "teacher_acted": False, "teacher_turns": episode.recovery.teacher_turns, "explorer_id": explorer_id})
        for s, sc in zip(steps, scores, strict=True)]
    episode.queued = len(episode.student_steps)
    episode.unscored = info.unscored_turns
    return Rollout(turns, info)


def count_rollout(stats: dict[str, float], info: RolloutInfo) -> None:
    """Add a finished rollout's info to the explorer's cumulative counters."""
    for key, value in (("rollouts", 1), ("turns", info.student_turns), ("teacher_turns", info.teacher_turns),
                       ("takeovers", info.takeovers), ("successes", info.success),
                       ("truncated_turns", info.truncated_turns), ("unscored_turns", info.unscored_turns),
                       ("step_limit_hits", info.hit_step_limit)):
        stats[key] += value


def eval_metrics(episodes: list[Episode], policy_version: int, t0: float) -> dict[str, float]:
    """``eval/*`` metrics of evaluation episodes that started at ``time.perf_counter()`` ``t0``."""
    n = len(episodes)
    return {
        "eval/success_rate": sum(e.success for e in episodes) / n,
        "eval/mean_score": sum(e.score for e in episodes) / n,
        "eval/mean_steps": sum(e.steps for e in episodes) / n,
        "eval/episodes": float(n),
        "eval/crashed": float(sum(e.crashed for e in episodes)),
        "eval/policy_version": float(policy_version),
        "eval/seconds": time.perf_counter() - t0,
    }


def episode_state(e: Episode) -> dict[str, Any]:
    """An episode as JSON (its +R allowed-set keys are not: the replayed env gives them back)."""
    r = e.recovery
    return {
        "rollout_id": e.rollout_id, "task": e.task, "first_observation": e.first_observation,
        "valid_actions": None if e.valid_actions is None else list(e.valid_actions),
        "history": [[a, o] for a, o in e.history],
        "student_steps": [{
            "step": s.step, "prompt_ids": [int(t) for t in s.prompt_ids], "prompt_truncated": bool(s.prompt_truncated),
            "response_ids": [int(t) for t in s.response_ids], "logprobs": _array_json(np.asarray(s.logprobs)),
            "policy_version": int(s.policy_version), "action": s.action, "reward": float(s.reward),
            "progress": bool(s.progress), "score": float(s.score)} for s in e.student_steps],
        "recovery": {"no_progress_streak": r.no_progress_streak, "in_takeover": r.in_takeover,
                     "teacher_turns": r.teacher_turns, "takeovers": r.takeovers, "last_action": r.last_action,
                     "log": [[actor, bool(np_)] for actor, np_ in r.log]},
        "steps": e.steps, "score": float(e.score), "success": bool(e.success), "done": bool(e.done),
        "crashed": bool(e.crashed), "queued": e.queued, "unscored": e.unscored,
    }


def episode_from_state(d: dict[str, Any]) -> Episode:
    """The episode :func:`episode_state` saved (allowed-set keys unset: a replay of its env fills them)."""
    recovery = RecoveryState(**{**d["recovery"], "log": [(a, bool(p)) for a, p in d["recovery"]["log"]]})
    steps = [StudentStep(**{**s, "prompt_ids": list(s["prompt_ids"]), "response_ids": list(s["response_ids"]),
                            "logprobs": _array_from(s["logprobs"])}) for s in d["student_steps"]]
    return Episode(**{**d, "history": [(a, o) for a, o in d["history"]], "student_steps": steps, "recovery": recovery})


def _array_json(a: np.ndarray) -> dict[str, Any]:
    """An array, exactly: dtype, shape and its bytes in base64."""
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def _array_from(d: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()
