"""The one loop (``run_loop``) with an in-memory runtime: Algorithm 1's accounting without envs, threads or Ray.

:class:`MemoryRuntime` is a :class:`~divopd.train.protocol.Runtime` whose "explorers" make synthetic scored turns
stamped with a policy version that lags the learner's (some arrive stale, some unscored); the trainer and learner are
the real ones (a tiny random model). The real runtimes run the same loop in ``test_lockstep.py``, ``test_train.py`` and
``test_ray_*.py``; this one pins what the loop itself promises, whatever the runtime.
"""

from __future__ import annotations

import inspect
import math
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from divopd.experience import Rollout, RolloutInfo, Turn
from divopd.learn.checkpoint import WeightHandle
from divopd.learn.protocol import LearnerProtocol
from divopd.train.assemble import RUNTIMES, open_run
from divopd.train.config import RuntimeSettings
from divopd.train.interrupt import StopRequest
from divopd.train.loop import run_loop
from divopd.train.protocol import EvalResult, Runtime, StatelessRuntime
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

B = 6  # tiny_config's sampler.batch_size


class MemoryRuntime(StatelessRuntime):
    """Every poll: ``per_poll`` rollouts of 1-3 synthetic turns; the turns' policy versions lag the published one by
    0-3 (δ = 2: some expire), every 7th rollout is unscored (the gate rejects it). Evaluations finish at once."""

    def __init__(self, vocab: int, per_poll: int = 2, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab, self.per_poll = vocab, per_poll
        self.version = 0
        self.polls = 0
        self.rollouts = 0
        self.produced = 0  # turns handed to the loop, by poll or at shutdown
        self.published: list[int] = []
        self.eval_requests: list[int] = []
        self.results: list[EvalResult] = []
        self.calls: list[str] = []

    @property
    def producer_intervals(self) -> int:
        return self.polls

    def _rollout(self) -> Rollout:
        n = self.rollouts
        self.rollouts += 1
        version = max(0, self.version - int(self.rng.integers(0, 4)))
        turns = []
        for t in range(int(self.rng.integers(1, 4))):
            length = int(self.rng.integers(1, 5))
            teacher = [math.nan] * length if n % 7 == 6 else (-self.rng.random(length) * 3).tolist()
            turns.append(Turn(rollout_id=f"m{n}", turn_index=t, policy_version=version,
                              prompt_ids=self.rng.integers(3, self.vocab, 4).tolist(),
                              response_ids=self.rng.integers(3, self.vocab, length).tolist(),
                              student_logprobs=(-self.rng.random(length)).tolist(), teacher_logprobs=teacher))
        self.produced += len(turns)
        info = RolloutInfo(rollout_id=f"m{n}", explorer_id=0, env="memory", task=f"task-{n}", success=n % 3 == 0,
                           score=float(n % 3 == 0), horizon=len(turns), student_turns=len(turns),
                           policy_version_min=version, policy_version_max=version)
        return Rollout(turns, info)

    def poll(self, timeout: float) -> list[Rollout]:
        self.polls += 1
        return [self._rollout() for _ in range(self.per_poll)]

    def check_alive(self) -> None:
        self.calls.append("check_alive")

    def publish(self, handle: WeightHandle) -> None:
        self.version = handle.version
        self.published.append(handle.version)

    def request_eval(self, update: int, handle: WeightHandle, counters: dict[str, float]) -> None:
        assert handle.version == update
        self.eval_requests.append(update)
        self.results.append(EvalResult(update, counters, {"eval/success_rate": update / 100}))

    def eval_results(self, timeout: float) -> list[EvalResult]:
        out, self.results = self.results, []
        return out

    def evals_pending(self) -> bool:
        return bool(self.results)

    def shutdown(self, interrupted: bool) -> list[Rollout]:
        self.calls.append(f"shutdown:{interrupted}")
        return [self._rollout()]  # finished but never polled: it must enter the ledger as queued

    def close(self, interrupted: bool) -> dict[str, Any]:
        self.calls.append(f"close:{interrupted}")
        return {"memory_polls": self.polls}


def _open(models: dict[str, str], run_dir: Path, **over: object) -> tuple[Any, MemoryRuntime]:
    cfg = tiny_config(models, run_dir, "divopd", updates=6, **{"eval.every": 2, "checkpoint.every": 4, **over})
    trainer, _ = open_run(cfg)
    assert isinstance(trainer.learner, LearnerProtocol)
    return trainer, MemoryRuntime(trainer.learner.model.get_input_embeddings().num_embeddings)


def test_run_loop_with_an_in_memory_runtime_keeps_algorithm_1s_accounting(tiny_models: dict[str, str],  # noqa: F811
                                                                          tmp_path: Path) -> None:
    trainer, runtime = _open(tiny_models, tmp_path / "run")
    summary = run_loop(trainer, runtime)
    ledger = summary["ledger"]
    # exactly one update per composed batch of B turns, to cfg.updates
    assert summary["updates"] == 6 and ledger["selected"] == 6 * B
    # every turn the runtime produced is accounted for (received = selected + expired + invalid + pending + queued),
    # including the rollout handed over at shutdown, and some turns were stale or unscored (not silently dropped)
    assert ledger["received"] == runtime.produced
    assert_ledger_identity(ledger)
    assert ledger["expired"] > 0 and ledger["invalid"] > 0
    # publish after every update, in order; evaluation on the schedule, plus the final snapshot (already due at 6)
    assert runtime.published == [1, 2, 3, 4, 5, 6]
    assert runtime.eval_requests == [2, 4, 6]
    assert runtime.calls[-2:] == ["shutdown:False", "close:False"] and summary["memory_polls"] == runtime.polls
    assert summary["interrupted"] is False
    # the runtime's production intervals reach the trainer (the loop reads the protocol's producer_intervals)
    assert 6 <= summary["producer_intervals"] <= runtime.polls
    rows = read_metrics(tmp_path / "run")
    updates = [r for r in rows if r["kind"] == "update"]
    assert [r["update"] for r in updates] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(r["learner/loss"]) and r["queue/producer_load"] > 0 for r in updates)
    assert [(r["update"], r["eval/success_rate"]) for r in rows if r["kind"] == "eval"] == \
        [(2, 0.02), (4, 0.04), (6, 0.06)]
    assert summary["rollouts"] == runtime.rollouts  # every rollout counted once (all finished here)


def test_a_stop_request_checkpoints_without_a_final_evaluation(tiny_models: dict[str, str],  # noqa: F811
                                                               tmp_path: Path) -> None:
    trainer, runtime = _open(tiny_models, tmp_path / "run", **{"eval.every": 100})

    class StopAfter:
        def on_update(self, trainer: Any, metrics: dict) -> None:
            if trainer.version == 3:
                stop.set()

        def on_eval(self, update: int, results: dict) -> None:
            pass

    stop = StopRequest()
    summary = run_loop(trainer, runtime, stop=stop, progress=StopAfter())
    assert summary["interrupted"] is True and summary["updates"] == 3
    assert runtime.eval_requests == [] and runtime.calls[-2:] == ["shutdown:True", "close:True"]
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == runtime.produced
    assert (tmp_path / "run" / "checkpoints" / "update-000003").is_dir()


def _protocol_members(protocol: type) -> set[str]:
    """Its methods and properties, and its declared attributes (``evaluates_in_place``, ``keeps_state``)."""
    return {name for name in [*vars(protocol), *protocol.__annotations__] if not name.startswith("_")}


def test_every_registered_runtime_implements_the_whole_runtime_protocol() -> None:
    pytest.importorskip("ray")
    from divopd.train.runtime.lockstep import LockstepRuntime
    from divopd.train.runtime.ray import RayRuntime
    from divopd.train.runtime.threads import ThreadsRuntime

    members = _protocol_members(Runtime)
    attributes = {"producer_intervals", "evaluates_in_place", "keeps_state"}
    assert {"poll", "publish", "request_eval", "eval_results", "shutdown", "close", "state_dict", "load_state_dict",
            *attributes} <= members
    for cls in (LockstepRuntime, ThreadsRuntime, RayRuntime, MemoryRuntime):
        missing = {m for m in members if not hasattr(cls, m)}
        assert not missing, f"{cls.__name__} lacks {missing}"
        for m in members - attributes:
            assert list(inspect.signature(getattr(cls, m)).parameters) == \
                list(inspect.signature(getattr(Runtime, m)).parameters), (cls.__name__, m)
    kinds = typing.get_args(RuntimeSettings.model_fields["kind"].annotation)
    assert set(RUNTIMES) == set(kinds)  # one registry entry per runtime.kind the config accepts
