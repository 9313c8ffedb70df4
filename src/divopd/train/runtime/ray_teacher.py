"""One shared teacher for every Ray explorer (``teacher.shared: true``): a teacher actor, the explorers' handle on it.

    ExplorerActor × N ── score_turns(prompts, responses, topk) ──► TeacherActor (HF model or vLLM engine)
                      ◄─ per turn (logprobs, top-k) ─────────────┘   (and generate(...) for +R takeovers)

Without it each explorer actor loads its own teacher copy (one vLLM engine per explorer with ``teacher.backend:
vllm``). The actor holds the model once (``teacher.actor_gpus`` GPUs) and serves the explorers' batched calls in
arrival order; a vLLM engine batches what it is given, so one engine serves many explorers' finished rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
import torch

from divopd.explore.generation import Generation
from divopd.train.config import TrainConfig
from divopd.train.runtime.common import load_teacher

__all__ = ["RemoteTeacher", "TeacherActor", "start_shared_teacher"]


class TeacherActor:
    """The teacher inside a Ray actor (wrapped with ``ray.remote`` at the edge, in :func:`start_shared_teacher`)."""

    def __init__(self, cfg_data: dict[str, Any]) -> None:
        cfg = TrainConfig.model_validate(cfg_data)
        torch.set_num_threads(cfg.runtime.torch_threads)
        self.teacher, self.tokenizer = load_teacher(cfg)
        self._topk = cfg.explorer.teacher_topk
        self.calls = 0

    def score_turns(self, prompts: list[list[int]], responses: list[list[int]]) -> list[tuple[Any, Any]]:
        self.calls += 1
        return self.teacher.score_turns(prompts, responses, topk=self._topk)

    def generate(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> list[Generation]:
        return self.teacher.generate(prompts, **kwargs)

    def stats(self) -> dict[str, float]:
        return {"teacher/calls": float(self.calls)}


class RemoteTeacher:
    """The :class:`~divopd.explore.teacher.Teacher` an explorer holds when the teacher is shared: the actor's calls,
    blocking."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[tuple[Any, Any]]:
        """``topk`` is the run's ``explorer.teacher_topk``, which the actor was built with."""
        return ray.get(self.actor.score_turns.remote([list(p) for p in prompts], [list(r) for r in responses]))

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]:
        kwargs = {"greedy": greedy, "temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed}
        return ray.get(self.actor.generate.remote([list(p) for p in prompts], kwargs))


def start_shared_teacher(cfg: TrainConfig, cfg_data: dict[str, Any]) -> Any | None:
    """The shared teacher actor of a run with ``teacher.shared``, else ``None`` (each explorer loads its own)."""
    if not cfg.teacher.shared:
        return None
    return ray.remote(TeacherActor).options(num_cpus=0, num_gpus=cfg.teacher.actor_gpus,
                                            name=None).remote(cfg_data)
