"""A lockstep explorer's state as JSON, and the explorer rebuilt from it (an exact resume of a lockstep run).

What a :class:`~divopd.explore.explorer.Explorer` driven by ``step_round`` holds between two rounds, and what
:func:`explorer_state` saves: per env slot the running episode (task, first observation, the actions taken and the
observations they gave, the student turns so far with their token ids and generating log probs, the +R state), the
generation-seed counter, the training task stream (how many tasks it gave, and the task RNG's state), the rollout
counter, the cumulative counters, the weights version the student copy holds (and the one waiting to be loaded), the
step limit, the seed and rollout-id prefix. Plain JSON, no pickle; the student copy's weights, when they are not the
checkpoint's own (the explorer loads newer weights only at a rollout boundary), go to a safetensors file
(:func:`save_student`).

:func:`restore_explorer` rebuilds the env instances by resetting each slot's env on its task and replaying its
actions (:func:`replay_episode`), checking that every observation comes back as it was recorded: an environment
that does not replay deterministically is refused with one line, never resumed with a different state."""

from __future__ import annotations

import base64
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from divopd.errors import UsageError
from divopd.explore.envs import Env, EnvCrash
from divopd.explore.episode import Episode, StudentStep
from divopd.explore.recovery import RecoveryState, _allowed

if TYPE_CHECKING:
    from divopd.explore.explorer import Explorer
    from divopd.learn.checkpoint import WeightHandle

__all__ = ["ReplayError", "replayable", "explorer_state", "restore_explorer", "replay_episode", "save_student",
           "load_student", "episode_state", "episode_from_state"]

#: The format of :func:`explorer_state`'s dict.
STATE_FORMAT = 1


class ReplayError(UsageError, RuntimeError):
    """An environment gave another observation when its recorded actions were replayed (not deterministic), or
    crashed on every try: the run cannot resume exactly (one line, exit 2)."""


def replayable(explorer: Explorer) -> bool:
    """Whether every env instance of the explorer replays deterministically (:attr:`Env.replayable
    <divopd.explore.envs.base.Env.replayable>`): only then can its state be restored."""
    return all(env.replayable for env in explorer._envs)


def explorer_state(explorer: Explorer) -> dict[str, Any]:
    """The JSON state of an explorer driven by ``step_round`` (between two rounds)."""
    if explorer._rollout_iter is not None:
        raise RuntimeError("explorer_state: only an explorer driven by step_round (the lockstep runtime) has one")
    pending = explorer._pending_weights
    return {
        "format": STATE_FORMAT,
        "seed": int(explorer.seed),
        "id_prefix": explorer.id_prefix,
        "policy_version": int(explorer.policy_version),
        "learner_version": int(explorer.learner_version),
        "pending_version": None if pending is None else int(pending.version),
        "max_steps": int(explorer.max_steps),
        "n_rollouts": explorer._n_rollouts,
        "gen_calls": explorer._gen_calls,
        "tasks_drawn": explorer._tasks_drawn,
        "task_rng": _rng_json(explorer._task_rng),
        "stats": dict(explorer._stats),
        "handed_over": dict(explorer._handed_over),
        "started": explorer._round_iter is not None,
        "slots": [None if e is None else episode_state(e) for e in explorer._slots],
    }


def restore_explorer(explorer: Explorer, state: dict[str, Any], weights: WeightHandle,
                     student_weights: Path | None = None) -> None:
    """Put a freshly built explorer (holding ``weights``, the checkpoint's) in ``state``: counters, seeds, task stream,
    the student copy's weights (``student_weights`` when its version is not ``weights.version``), and each slot's
    env replayed to where its episode was. Raises :class:`ReplayError` when an env does not replay."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"explorer state format {state.get('format')!r}, expected {STATE_FORMAT}")
    e = explorer
    e.seed, e.id_prefix = int(state["seed"]), str(state["id_prefix"])
    e.learner_version, e.max_steps = int(state["learner_version"]), int(state["max_steps"])
    e._n_rollouts, e._gen_calls = int(state["n_rollouts"]), int(state["gen_calls"])
    e._stats.update({k: float(v) for k, v in state["stats"].items()})
    e._handed_over = {k: float(v) for k, v in state["handed_over"].items()}
    e._task_rng = random.Random(f"{e.seed}-{e.explorer_id}-tasks")
    version = int(state["policy_version"])
    if version != int(weights.version):
        if student_weights is None:
            raise ValueError(f"explorer {e.explorer_id}: its student copy held version {version}, not the "
                             f"checkpoint's {weights.version}, and no weights file was given")
        load_student(e, student_weights)
        e.policy_version = version
    pending = state["pending_version"]
    if pending is not None and int(pending) != int(weights.version):
        raise ValueError(f"explorer {e.explorer_id}: weights version {pending} waited to be loaded, but the "
                         f"checkpoint is of version {weights.version}")
    e._pending_weights = weights if pending is not None and version != int(weights.version) else None
    if not state["started"]:
        e._tasks_drawn = 0
        return
    e._envs = e._envs or [e._new_env() for _ in range(e.config.num_envs)]
    if not replayable(e):
        raise ReplayError(f"env {e.config.env!r} does not replay (Env.replayable is False); this run cannot resume "
                          "exactly")
    e._tasks_drawn = 0
    tasks = e._train_task_stream()
    for _ in range(int(state["tasks_drawn"])):
        next(tasks)
    if _rng_json(e._task_rng) != state["task_rng"]:
        raise ValueError(f"explorer {e.explorer_id}: the task stream did not come back to its saved position")
    e._slots[:] = [None if s is None else replay_episode(e, i, s) for i, s in enumerate(state["slots"])]
    e._round_iter = e._rounds(e._envs, tasks, evaluating=False, slots=e._slots)


def replay_episode(explorer: Explorer, i: int, state: dict[str, Any]) -> Episode:
    """Reset env slot ``i`` on the episode's task and replay its actions (in the calls the explorer made: reset, then
    ``valid_actions`` and ``allowed_actions_key`` after it and after each step); the episode of ``state`` with its +R
    state's allowed-set keys taken from the replayed env. An env crash is retried on a fresh instance."""
    episode = episode_from_state(state)
    for attempt in range(explorer.config.max_env_restarts + 1):
        try:
            keys = _replay(explorer._envs[i], episode)
            break
        except EnvCrash as exc:
            if attempt == explorer.config.max_env_restarts:
                raise ReplayError(f"explorer {explorer.explorer_id}: env {explorer.config.env!r} crashed replaying "
                                  f"rollout {episode.rollout_id}: {exc}") from exc
            explorer._envs[i] = explorer._replace_env(explorer._envs[i])
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
    keys = [_allowed(env.allowed_actions_key(), first)]
    for n, (action, observation) in enumerate(episode.history):
        obs, _, _, _ = env.step(action)
        check(f"observation at step {n}", obs, observation)
        valid = env.valid_actions()
        keys.append(_allowed(env.allowed_actions_key(), obs))
    check("valid-action list", None if valid is None else list(valid), episode.valid_actions)
    return keys


# ---------------------------------------------------------------------------------------------------- episodes
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
    """The episode :func:`episode_state` saved (allowed-set keys unset: :func:`replay_episode` fills them)."""
    r = d["recovery"]
    recovery = RecoveryState(no_progress_streak=r["no_progress_streak"], in_takeover=r["in_takeover"],
                             teacher_turns=r["teacher_turns"], takeovers=r["takeovers"], last_action=r["last_action"],
                             log=[(a, bool(p)) for a, p in r["log"]])
    steps = [StudentStep(step=s["step"], prompt_ids=list(s["prompt_ids"]), prompt_truncated=s["prompt_truncated"],
                         response_ids=list(s["response_ids"]), logprobs=_array_from(s["logprobs"]),
                         policy_version=s["policy_version"], action=s["action"], reward=s["reward"],
                         progress=s["progress"], score=s["score"]) for s in d["student_steps"]]
    return Episode(rollout_id=d["rollout_id"], task=d["task"], first_observation=d["first_observation"],
                   valid_actions=d["valid_actions"], history=[(a, o) for a, o in d["history"]], student_steps=steps,
                   recovery=recovery, steps=d["steps"], score=d["score"], success=d["success"], done=d["done"],
                   crashed=d["crashed"], queued=d["queued"], unscored=d["unscored"])


# ---------------------------------------------------------------------------------------------------- weights
def save_student(explorer: Explorer, path: Path) -> None:
    """Write the explorer's student copy's weights to ``path`` (safetensors; temporary name, then rename)."""
    from safetensors.torch import save_model

    if explorer.student is None:
        raise ValueError("save_student: the explorer has no HF student copy (a vLLM engine holds its weights)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_model(explorer.student, str(tmp))
    tmp.replace(path)


def load_student(explorer: Explorer, path: Path) -> None:
    """Load :func:`save_student`'s file into the explorer's student copy."""
    from safetensors.torch import load_model

    if not path.is_file():
        raise FileNotFoundError(f"explorer {explorer.explorer_id}: the weights its student copy held, {path}, are "
                                "missing")
    load_model(explorer.student, str(path))


# ---------------------------------------------------------------------------------------------------- JSON helpers
def _array_json(a: np.ndarray) -> dict[str, Any]:
    """An array, exactly: dtype, shape and its bytes in base64."""
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def _array_from(d: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def _rng_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]
