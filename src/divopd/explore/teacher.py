"""The frozen teacher as the explorer sees it: the :class:`Teacher` protocol and its in-process HF implementation
(the others: ``VLLMGenerator``, ``RemoteTeacher``, ``ServerTeacher``; docs/concepts/teacher.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from divopd.experience.turn import ResponseScores
from divopd.explore.generation import Generation, HFGenerator
from divopd.models.scoring import score_responses

__all__ = ["HFTeacher", "ResponseScores", "Teacher", "as_teacher"]


@runtime_checkable
class Teacher(Protocol):
    """What the explorer needs from the frozen teacher: scores of every student response token, after a rollout or a
    round, and its own actions under +R."""

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[ResponseScores]:
        """Per turn, the log probs of the response tokens given their prompt (and with ``topk`` > 0 the top-k)."""
        ...

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]:
        """One response per prompt (the teacher acting under +R)."""
        ...


class HFTeacher:
    """A Hugging Face model as a :class:`Teacher` (frozen: scored under ``no_grad``); ``max_tokens_per_batch`` bounds
    one scoring forward, ``stop_on_newline`` is its +R actions' setting."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, max_tokens_per_batch: int,
                 stop_on_newline: bool = True) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_tokens_per_batch = max_tokens_per_batch
        self.pad_id = tokenizer.pad_token_id or 0
        self._stop_on_newline = stop_on_newline
        self._generator: HFGenerator | None = None  # built on the first +R takeover (it scans the vocabulary)

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[ResponseScores]:
        return score_responses(self.model, prompts, responses, topk=topk, pad_id=self.pad_id,
                               max_tokens_per_batch=self.max_tokens_per_batch)

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]:
        if self._generator is None:
            self._generator = HFGenerator(self.model, self.tokenizer, stop_on_newline=self._stop_on_newline)
        return self._generator.generate(prompts, greedy=greedy, temperature=temperature,
                                        max_new_tokens=max_new_tokens, seed=seed)


def as_teacher(teacher: Teacher | torch.nn.Module, tokenizer: Any, *, max_tokens_per_batch: int,
               stop_on_newline: bool = True) -> Teacher:
    """``teacher`` itself when it is a :class:`Teacher`, else the HF model wrapped in an :class:`HFTeacher`."""
    if isinstance(teacher, torch.nn.Module):
        return HFTeacher(teacher, tokenizer, max_tokens_per_batch=max_tokens_per_batch,
                         stop_on_newline=stop_on_newline)
    return teacher
