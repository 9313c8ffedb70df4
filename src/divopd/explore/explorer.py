"""The explorer: the student plays env instances turn by turn and the frozen teacher scores its turns (Algorithm 1's
explore stage)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from divopd.experience.turn import ResponseScores, Rollout
from divopd.explore.envs import Env, EnvCrash, make_env
from divopd.explore.episode import (
    EXPLORER_COUNTERS,
    Action,
    Actor,
    Episode,
    StudentStep,
    build_rollout,
    count_rollout,
    episode_from_state,
    episode_state,
    eval_metrics,
)
from divopd.explore.generation import GenerationBackend, HFGenerator
from divopd.explore.prompting import decode_action, encode_prompt
from divopd.explore.replay import ReplayError, load_student, replay_episode
from divopd.explore.scoring import teacher_scores
from divopd.explore.settings import ExplorerConfig
from divopd.explore.tasks import close_quietly, reset_with_retries, start_env, task_stream
from divopd.explore.teacher import Teacher, as_teacher
from divopd.explore.vocab import student_ids_teacher
from divopd.explore.weight_loading import apply_weights, close_backend

__all__ = ["Explorer", "ExplorerConfig", "Rollout"]

if TYPE_CHECKING:
    from divopd.learn.checkpoint import WeightHandle

log = logging.getLogger(__name__)

STATE_FORMAT = 1  # of Explorer.state_dict


class Explorer:
    """Runs the student on ``config.num_envs`` env instances and turns its rollouts into scored :class:`Turn` s
    (docs/concepts/explorers.md). Runtimes drive it through :meth:`collect` (lockstep: :meth:`step_round`),
    :meth:`set_weights`, :meth:`evaluate` and :meth:`close`.

    ``student`` is used in place (``None`` with a ``student_backend`` that holds its own weights); ``teacher``, a
    :class:`~divopd.explore.teacher.Teacher` or an HF causal LM (``None``: turns unscored), is wrapped to score the
    student's ids when ``teacher_tokenizer`` is another. Rollout ids are ``f"{id_prefix}{explorer_id}-{n}"``.
    ``step_limit`` gives the training step limit of published weights (TCOD's depth, TurnOPD's budget; ``None``:
    ``config.max_steps``); ``weights`` is the handle the student copy holds (version ``policy_version``).
    """

    def __init__(self, config: ExplorerConfig, student: Any, tokenizer: Any, teacher: Any | None = None,
                 teacher_tokenizer: Any | None = None, *, seed: int = 0, explorer_id: int = 0, policy_version: int = 0,
                 env_factory: Callable[[], Env] | None = None, id_prefix: str = "x",
                 student_backend: GenerationBackend | None = None, step_limit: Callable[[Any], int] | None = None,
                 weights: WeightHandle | None = None) -> None:
        self.config = config
        self.student = student
        self.tokenizer = tokenizer
        self.teacher = teacher  # as given (an HF model or a Teacher)
        self.teacher_tokenizer = teacher_tokenizer if teacher_tokenizer is not None else tokenizer
        if config.recovery.enabled and teacher is None:
            raise ValueError("Explorer: recovery.enabled needs a teacher to act")
        self.seed = seed
        self.explorer_id = explorer_id
        self.id_prefix = id_prefix
        self.policy_version = policy_version
        self.learner_version = policy_version
        self._env_factory = env_factory or (lambda: make_env(config.env, **config.env_kwargs))
        stop_nl = config.generation.stop_on_newline
        self._student_gen = student_backend or HFGenerator(student, tokenizer, stop_on_newline=stop_nl)
        self._teacher: Teacher | None = None
        if teacher is not None:
            self._teacher = as_teacher(teacher, self.teacher_tokenizer,
                                       max_tokens_per_batch=config.teacher_max_tokens_per_batch,
                                       stop_on_newline=stop_nl)
            if self.teacher_tokenizer is not tokenizer:  # another vocabulary: a teacher of the student's ids
                self._teacher, self.teacher_tokenizer = student_ids_teacher(
                    self._teacher, tokenizer, self.teacher_tokenizer, topk=config.teacher_topk)
        self._teacher_gen = self._teacher if config.recovery.enabled else None
        self._step_limit = step_limit  # the step limit now: config.max_steps, or step_limit of the newest weights
        self.max_steps = config.max_steps if step_limit is None else step_limit(weights or policy_version)
        self._lock = threading.Lock()
        self._pending_weights: WeightHandle | None = None  # the newest published handle not yet loaded
        self._envs: list[Env] = []  # the training instances
        self._eval_envs: list[Env] = []
        self._rollout_iter: Iterator[Rollout] | None = None
        self._round_iter: Iterator[tuple[list[Episode], list[Episode]]] | None = None
        self._task_rng = random.Random(f"{seed}-{explorer_id}-tasks")
        self._train_tasks: list[str] = []
        self._n_rollouts = 0
        self._gen_calls = 0
        self._tasks_drawn = 0  # the training task stream's position
        self._slots: list[Episode | None] = []  # step_round's running episode per env slot
        self._stats: dict[str, float] = dict.fromkeys(EXPLORER_COUNTERS, 0.0)
        self._handed_over: dict[str, float] = {}  # the stage times as of the previous rollout handed over

    def collect(self, num_rollouts: int) -> list[Rollout]:
        """The next ``num_rollouts`` finished rollouts (in-flight rollouts carry over to the next call)."""
        return [next(self.rollouts()) for _ in range(num_rollouts)]  # one stream per explorer: the same each call

    def rollouts(self) -> Iterator[Rollout]:
        """The endless stream of finished rollouts of the training split, in the order they end (the same each call)."""
        if self._rollout_iter is None:
            if self._round_iter is not None:
                raise RuntimeError("Explorer.rollouts: this explorer is driven by step_round (lockstep runtime)")
            self._rollout_iter = self._rollout_stream()
        return self._rollout_iter

    def _rollout_stream(self) -> Iterator[Rollout]:  # each rollout is built (scored, counted) only when taken
        self._apply_pending_weights()
        self._envs = self._envs or [self._new_env() for _ in range(self.config.num_envs)]
        for ended, stepped in self._rounds(self._envs, self._train_task_stream(), evaluating=False):
            for rollout in self._queue_round(ended, stepped):
                yield rollout
                if ended and self.config.load_weights == "rollout":  # the next turns use the newest weights
                    self._apply_pending_weights()

    def set_weights(self, handle: WeightHandle) -> None:
        """Queue a published weight handle (``.version``, ``.load_into(model)``), loaded at the next rollout boundary;
        the step limit follows it at once. Thread-safe; a newer handle replaces an older one not yet loaded."""
        with self._lock:
            if self._pending_weights is None or handle.version >= self._pending_weights.version:
                self._pending_weights = handle
            self.learner_version = max(self.learner_version, int(handle.version))
            if self._step_limit is not None:  # the curriculum follows the learner at once (running rollouts too)
                self.max_steps = self._step_limit(handle)

    def evaluate(self, tasks: Iterable[str] | None = None, num_tasks: int | None = None, *,
                 temperature: float = 0.4, greedy: bool = False, seed: int | None = None) -> dict[str, float]:
        """Student-only episodes (no recovery) on ``tasks``, default the first ``num_tasks`` (``config.eval_tasks``)
        of ``config.eval_split``: ``eval/*`` metrics. Sampling at ``temperature`` is seeded by ``seed`` (default: the
        explorer's) and this evaluation's calls only. Not concurrently with :meth:`rollouts`."""
        if not greedy and temperature <= 0:
            raise ValueError(f"Explorer.evaluate: temperature must be > 0 when sampling, got {temperature}")
        self._apply_pending_weights()
        self._eval_envs = self._eval_envs or [self._new_env()]
        if tasks is None:
            tasks = self._eval_envs[0].tasks(self.config.eval_split)[: num_tasks or self.config.eval_tasks]
        if not (tasks := list(tasks)):
            raise ValueError("Explorer.evaluate: no tasks to evaluate")
        n = min(self.config.num_envs, len(tasks))  # one instance per task up to num_envs (a twx one is a JVM)
        envs = self._eval_envs[:n] + [self._new_env() for _ in range(n - len(self._eval_envs))]
        self._eval_decoding = (greedy, float(temperature), self.seed if seed is None else int(seed))
        self._eval_calls = 0
        t0 = time.perf_counter()
        try:
            episodes = [e for ended, _ in self._rounds(envs, iter(tasks), evaluating=True) for e in ended]
        finally:  # keep the instances _rounds replaced
            self._eval_envs[:n] = envs
        return eval_metrics(episodes, self.policy_version, t0)

    def _decoding(self, actor: str, evaluating: bool) -> tuple[bool, float, int]:
        """``(greedy, temperature, seed)`` of one generate call: :meth:`evaluate`'s if evaluating, else the config's."""
        if evaluating:
            greedy, temperature, seed = self._eval_decoding
            self._eval_calls += 1
            state = np.random.SeedSequence(seed, spawn_key=(0xE7A1, self._eval_calls)).generate_state(1)[0]
            return greedy, temperature, int(state)
        greedy = self.config.generation.greedy if actor == "student" else self.config.recovery.teacher_greedy
        self._gen_calls += 1
        seed = int(np.random.SeedSequence([self.seed, self.explorer_id, self._gen_calls]).generate_state(1)[0])
        return greedy, self.config.generation.temperature, seed

    def stats(self) -> dict[str, float]:
        """Cumulative counters, namespaced ``explorer/...`` (rollouts, turns, env_crashes, teacher_failures, ...)."""
        stats = {f"explorer/{k}": v for k, v in self._stats.items()}
        return stats | {"explorer/policy_version": float(self.policy_version)}

    def close(self) -> None:
        """Close every env instance (ends their JVMs)."""
        for env in self._envs + self._eval_envs:
            try:
                env.close()
            except Exception as exc:  # closing must not mask the caller's own error
                log.warning("explorer %s: closing %s failed: %s", self.explorer_id, env.name, exc)
        self._envs, self._eval_envs = [], []
        close_backend(self._student_gen)

    def __enter__(self) -> Explorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step_round(self) -> tuple[list[Rollout], int]:
        """One round on the training envs, each instance one step: the rollouts that ended (``enqueue: turn``: every
        stepped rollout's new turns, as chunks) and the env steps taken. Not mixed with :meth:`collect`."""
        if self._rollout_iter is not None:
            raise RuntimeError("Explorer.step_round: this explorer already streams rollouts (collect/rollouts)")
        if self._round_iter is None:
            self._apply_pending_weights()
            self._envs = self._envs or [self._new_env() for _ in range(self.config.num_envs)]
            self._round_iter = self._rounds(self._envs, self._train_task_stream(), evaluating=False, slots=self._slots)
        ended, stepped = next(self._round_iter)
        rollouts = list(self._queue_round(ended, stepped))
        if ended and self.config.load_weights == "rollout":  # the slots' next episodes use the newest weights
            self._apply_pending_weights()
        return rollouts, len(stepped)

    def _rounds(self, envs: list[Env], tasks: Iterator[str], evaluating: bool,
                slots: list[Episode | None] | None = None) -> Iterator[tuple[list[Episode], list[Episode]]]:
        """Step every live env once per round; yield (episodes that ended, episodes stepped) after each round.
        ``slots``: the list that holds each slot's running episode (kept up to date; started here when empty)."""
        batch = not evaluating and self.config.load_weights == "batch"  # an ended slot waits until all ended
        episodes: list[Episode | None] = [] if slots is None else slots
        episodes[:] = episodes or [self._start_episode(envs, i, tasks) for i in range(len(envs))]
        while any(e is not None for e in episodes):
            live = [i for i, e in enumerate(episodes) if e is not None]
            actors = {i: episodes[i].recovery.next_actor(self.learner_version, self.config.recovery, evaluating)
                      for i in live}
            actions = self._act(episodes, actors, evaluating)
            stepped = [episodes[i] for i in live]
            for i in live:
                self._step_env(envs, i, episodes[i], actions[i])
            ended = []
            for i in live:
                episode = episodes[i]
                if episode.done:
                    ended.append(episode)
                    episodes[i] = None if batch else self._start_episode(envs, i, tasks)
            if batch and all(e is None for e in episodes):
                self._apply_pending_weights()
                episodes[:] = [self._start_episode(envs, i, tasks) for i in range(len(envs))]
            yield ended, stepped

    def _act(self, episodes: list[Episode | None], actors: dict[int, Actor], evaluating: bool) -> dict[int, Action]:
        """One batched generate for the student-controlled episodes (and one for the teacher's, under +R)."""
        out: dict[int, Action] = {}
        for actor in ("student", "teacher"):
            idx = [i for i, a in actors.items() if a == actor]
            if not idx:
                continue
            tok = self.tokenizer if actor == "student" else self.teacher_tokenizer
            prompts = [encode_prompt(tok, self.config.prompt, episodes[i].first_observation, episodes[i].history,
                                     episodes[i].valid_actions) for i in idx]
            gen = self._student_gen if actor == "student" else self._teacher_gen
            greedy, temperature, seed = self._decoding(actor, evaluating)
            t0 = time.perf_counter()
            results = gen.generate([p.ids for p in prompts], greedy=greedy, temperature=temperature,
                                   max_new_tokens=self.config.generation.max_new_tokens, seed=seed)
            self._stats["time/generate"] += time.perf_counter() - t0
            for i, prompt, result in zip(idx, prompts, results, strict=True):
                out[i] = Action(actor, prompt, result, decode_action(tok, result.response_ids))
                if actor == "student":
                    self._stats["generated_tokens"] += len(result.response_ids)
        return out

    def _step_env(self, envs: list[Env], i: int, episode: Episode, action: Action) -> None:
        """Apply one action to env ``i``; record the student turn, +R bookkeeping and the end conditions."""
        if action.actor == "student":
            episode.student_steps.append(StudentStep(
                step=episode.steps, prompt_ids=action.prompt.ids, prompt_truncated=action.prompt.truncated,
                response_ids=action.generation.response_ids, logprobs=action.generation.logprobs,
                policy_version=self.policy_version, action=action.text))
        t0 = time.perf_counter()
        try:
            obs, reward, done, info = envs[i].step(action.text)
        except EnvCrash as exc:
            self._stats["time/env"] += time.perf_counter() - t0
            log.warning("explorer %s: env crashed in rollout %s (%s); replacing the instance",
                        self.explorer_id, episode.rollout_id, exc)
            self._stats["env_crashes"] += 1
            episode.crashed = episode.done = True
            envs[i] = self._replace_env(envs[i])
            return
        self._stats["time/env"] += time.perf_counter() - t0
        self._stats["env_steps"] += 1
        episode.steps += 1
        episode.score = float(info.get("score", 0.0))
        episode.success = bool(info.get("success", False))
        episode.history.append((action.text, obs))
        episode.valid_actions = envs[i].valid_actions()
        # +R: the paper's no-progress turn (an invalid action, or a repeat while the allowed actions are unchanged)
        no_progress = episode.recovery.step(action.actor, action.text, bool(info.get("invalid", False)),
                                            envs[i].allowed_actions_key(), obs, self.config.recovery)
        if action.actor == "student":
            last = episode.student_steps[-1]
            last.reward = float(reward)
            last.progress = not no_progress
            last.score = float(info.get("score", 0.0))
        episode.done = bool(done) or episode.steps >= self.max_steps

    def _queue_round(self, ended: list[Episode], stepped: list[Episode]) -> Iterator[Rollout]:
        """The round's queued turns, lazily: each ended rollout scored in one teacher pass (``enqueue: rollout``), or
        every stepped rollout's new student turns scored together in one pass and returned as chunks (``turn``)."""
        if self.config.enqueue == "rollout":
            for e in ended:
                yield self._build(e, self._teacher_scores([s.prompt_ids for s in e.student_steps],
                                                          [s.response_ids for s in e.student_steps]))
            return
        chunks = [e for e in stepped if e.done or len(e.student_steps) > e.queued]
        flat = [s for e in chunks for s in e.student_steps[e.queued:]]
        scores = self._teacher_scores([s.prompt_ids for s in flat], [s.response_ids for s in flat])
        ends = np.cumsum([0] + [len(e.student_steps) - e.queued for e in chunks])
        for e, a, b in zip(chunks, ends[:-1], ends[1:], strict=True):
            yield self._build(e, scores[a:b], start=e.queued)

    def _build(self, episode: Episode, scores: list[ResponseScores | None], start: int = 0) -> Rollout:
        """The Rollout (or chunk) of ``episode``'s student turns ``start:``; an ended rollout is counted."""
        rollout = build_rollout(episode, scores, explorer_id=self.explorer_id, env=self.config.env,
                                max_steps=self.max_steps, policy_version=self.policy_version,
                                truncated_dead=self.config.truncated_turns_dead, start=start)
        if episode.done:
            count_rollout(self._stats, rollout.info)
        rollout.info.weight_load_s = self._stats["time/weight_load_s"]  # the newest weight load (train metrics)
        rollout.info.set_stage_times(self._stats, self._handed_over)  # explorer seconds since the previous one
        return rollout

    def _teacher_scores(self, prompts: list[list[int]], responses: list[list[int]]) -> list[ResponseScores | None]:
        """The teacher's scores per turn (``None`` = unscored), retried turn by turn on a failure."""
        teacher = self._teacher
        if teacher is None or not prompts:
            return [None] * len(prompts)
        topk = self.config.teacher_topk
        return teacher_scores(lambda p, r: teacher.score_turns(p, r, topk=topk), prompts, responses, self._stats,
                              self.explorer_id)

    def _start_episode(self, envs: list[Env], i: int, tasks: Iterator[str]) -> Episode | None:
        """Reset env ``i`` on the next task (``None`` when ``tasks`` is exhausted); a crash replaces the instance."""
        task = next(tasks, None)
        if task is None:
            return None
        first = reset_with_retries(envs, i, task, self._replace_env, self.config.max_env_restarts, self._stats,
                                   f"Explorer {self.explorer_id}", self.config.env)
        episode = Episode(rollout_id=f"{self.id_prefix}{self.explorer_id}-{self._n_rollouts}", task=task,
                          first_observation=first, valid_actions=envs[i].valid_actions())
        self._n_rollouts += 1
        episode.recovery.start(envs[i].allowed_actions_key(), first)
        return episode

    def _new_env(self) -> Env:
        return start_env(self._env_factory, self.config.max_env_restarts, f"Explorer {self.explorer_id}",
                         self.config.env)

    def _replace_env(self, env: Env) -> Env:
        close_quietly(env, f"explorer {self.explorer_id}")
        return self._new_env()

    def _train_task_stream(self) -> Iterator[str]:
        self._train_tasks = self._train_tasks or list(self._envs[0].tasks(self.config.split))
        if not self._train_tasks:
            raise ValueError(f"Explorer: env {self.config.env!r} has no tasks in split {self.config.split!r}")
        for task in task_stream(self._train_tasks, self.config.task_order, self._task_rng, self.explorer_id):
            self._tasks_drawn += 1
            yield task

    def _apply_pending_weights(self) -> None:
        with self._lock:
            handle, self._pending_weights = self._pending_weights, None
        if handle is not None and int(handle.version) != self.policy_version:
            self._stats["time/weight_load_s"] = apply_weights(handle, self.student, self._student_gen)
            self.policy_version = int(handle.version)
            self._stats["weight_loads"] += 1

    def replayable(self) -> bool:
        """Whether every env instance replays deterministically (needed by :meth:`load_state_dict`)."""
        return all(env.replayable for env in self._envs)

    def state_dict(self) -> dict[str, Any]:
        """What an explorer driven by :meth:`step_round` holds between two rounds, as plain JSON (the student copy's
        weights aside: :func:`~divopd.explore.replay.save_student`)."""
        if self._rollout_iter is not None:
            raise RuntimeError("Explorer.state_dict: only an explorer driven by step_round (lockstep) has one")
        pending = self._pending_weights
        return {
            "format": STATE_FORMAT,
            "seed": int(self.seed),
            "id_prefix": self.id_prefix,
            "policy_version": int(self.policy_version),
            "learner_version": int(self.learner_version),
            "pending_version": None if pending is None else int(pending.version),
            "max_steps": int(self.max_steps),
            "n_rollouts": self._n_rollouts,
            "gen_calls": self._gen_calls,
            "tasks_drawn": self._tasks_drawn,
            "task_rng": _rng_json(self._task_rng),
            "stats": dict(self._stats),
            "handed_over": dict(self._handed_over),
            "started": self._round_iter is not None,
            "slots": [None if e is None else episode_state(e) for e in self._slots],
        }

    def load_state_dict(self, state: dict[str, Any], weights: WeightHandle,
                        student_weights: Path | None = None) -> None:
        """Put this freshly built explorer (holding ``weights``, the checkpoint's) in :meth:`state_dict`'s ``state``,
        its student copy in ``student_weights`` when its version is not ``weights.version``, and replay each slot's
        env to where its episode was; :class:`~divopd.explore.replay.ReplayError` when an env does not replay."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"explorer state format {state.get('format')!r}, expected {STATE_FORMAT}")
        self.seed = int(state["seed"])
        self.id_prefix = str(state["id_prefix"])
        self.learner_version = int(state["learner_version"])
        self.max_steps = int(state["max_steps"])
        self._n_rollouts = int(state["n_rollouts"])
        self._gen_calls = int(state["gen_calls"])
        self._stats.update({k: float(v) for k, v in state["stats"].items()})
        self._handed_over = {k: float(v) for k, v in state["handed_over"].items()}
        self._task_rng = random.Random(f"{self.seed}-{self.explorer_id}-tasks")
        version = int(state["policy_version"])
        if version != int(weights.version):
            if student_weights is None:
                raise ValueError(f"explorer {self.explorer_id}: its student copy held version {version}, not the "
                                 f"checkpoint's {weights.version}, and no weights file was given")
            load_student(self.student, student_weights)
            self.policy_version = version
        pending = state["pending_version"]
        if pending is not None and int(pending) != int(weights.version):
            raise ValueError(f"explorer {self.explorer_id}: weights version {pending} waited to be loaded, but the "
                             f"checkpoint is of version {weights.version}")
        self._pending_weights = weights if pending is not None and version != int(weights.version) else None
        self._tasks_drawn = 0
        if not state["started"]:
            return
        self._envs = self._envs or [self._new_env() for _ in range(self.config.num_envs)]
        if not self.replayable():
            raise ReplayError(f"env {self.config.env!r} does not replay (Env.replayable is False); this run cannot "
                              "resume exactly")
        tasks = self._train_task_stream()
        for _ in range(int(state["tasks_drawn"])):
            next(tasks)
        if _rng_json(self._task_rng) != state["task_rng"]:
            raise ValueError(f"explorer {self.explorer_id}: the task stream did not come back to its saved position")
        self._slots[:] = [None if s is None else replay_episode(self._envs, i, episode_from_state(s),
                                                                self._replace_env, self.config.max_env_restarts)
                          for i, s in enumerate(state["slots"])]
        self._round_iter = self._rounds(self._envs, tasks, evaluating=False, slots=self._slots)


def _rng_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]
