"""The rollout side of per-turn selection in verl 0.9.1: one teacher-scored TransferQueue record per student turn
(verl's TQ worker scores only a session's last output). A turn split from a session output by :func:`split_turns`
carries the session's ``min_global_steps`` (so it may expire early, never late); ``routed_experts`` is not split.
"""

from __future__ import annotations

from typing import Any

import ray
import transfer_queue as tq
from verl.experimental.agent_loop import AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

import divopd.integrations.verl_env_agent  # noqa: F401  (registers divopd_env_agent in the worker processes)
from divopd.integrations.verl_dispatch import claim
from divopd.integrations.verl_records import SUMMARY_TAG, record_summary

__all__ = ["DivOPDAgentLoopManagerTQ", "DivOPDAgentLoopWorkerTQ", "split_turns", "turn_spans"]


def turn_spans(response_mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of 1s (one assistant turn) in a session's ``response_mask``."""
    spans, start = [], None
    for i, flag in enumerate(list(response_mask) + [0]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            spans.append((start, i))
            start = None
    return spans


def split_turns(output: AgentLoopOutput) -> list[AgentLoopOutput]:
    """One output per assistant turn of a session's output (an output without any student token is kept as it is)."""
    spans = turn_spans(output.response_mask)
    if len(spans) <= 1 and (not spans or spans[0] == (0, len(output.response_ids))):
        return [output]
    logprobs = output.response_logprobs
    turns = []
    for index, (start, end) in enumerate(spans):
        turns.append(output.model_copy(update={
            "prompt_ids": list(output.prompt_ids) + list(output.response_ids[:start]),
            "response_ids": list(output.response_ids[start:end]),
            "response_mask": [1] * (end - start),
            "response_logprobs": None if logprobs is None else list(logprobs[start:end]),
            "routed_experts": None,
            "reward_score": output.reward_score if index == len(spans) - 1 else None,
            "extra_fields": {**output.extra_fields, "turn_index": index},
        }, deep=False))
    return turns


class _DivOPDWorker(AgentLoopWorkerTQ.__ray_actor_class__):  # the class under verl's @ray.remote
    """verl's TQ worker, writing one record per assistant turn, each teacher-scored and tagged with divopd's summary."""

    async def _agent_loop_postprocess(self, output: AgentLoopOutput | list[AgentLoopOutput], validate: bool,
                                      **kwargs: Any) -> None:
        outputs = [t for o in (output if isinstance(output, list) else [output]) for t in split_turns(o)]
        for turn in outputs:  # verl's own call (the last output) then finds it scored
            await self._compute_teacher_logprobs(turn, prompt_ids=turn.prompt_ids, response_ids=turn.response_ids,
                                                 validate=validate, sample_kwargs=kwargs)
        if outputs:
            await self._put_summaries(outputs, validate, kwargs)
        await super()._agent_loop_postprocess(outputs, validate, **kwargs)

    async def _compute_teacher_logprobs(self, output: AgentLoopOutput, prompt_ids: list[int],
                                        response_ids: list[int], validate: bool, sample_kwargs: Any = None) -> None:
        """verl's teacher path, once per output (an output this worker scored already is left as it is)."""
        if output.extra_fields.get("teacher_logprobs") is None:
            await super()._compute_teacher_logprobs(output, prompt_ids=prompt_ids, response_ids=response_ids,
                                                    validate=validate, sample_kwargs=sample_kwargs)

    async def _put_summaries(self, outputs: list[AgentLoopOutput], validate: bool, kwargs: dict[str, Any]) -> None:
        """Tag the records-to-be with divopd's summary and ``prompt_truncated`` (a tag-only put *before* verl writes
        the fields and its ``status``: the replay buffer reads a record only once it has a status)."""
        keys, tags = [], []
        for index, output in enumerate(outputs):
            key = f"{kwargs['uid']}_{kwargs['session_id']}_{index}"
            extra = output.extra_fields
            tag: dict[str, Any] = {"prompt_truncated": bool(extra.get("prompt_truncated", False))}
            if extra.get("min_global_steps") is not None:
                version = {"min_global_steps": extra["min_global_steps"]}
                tag[SUMMARY_TAG] = record_summary(key, {**tag, **version}, output.as_dict())[1]
            keys.append(key)
            tags.append(tag)
        await tq.async_kv_batch_put(keys=keys, tags=tags, partition_id="train" if not validate else "val")


DivOPDAgentLoopWorkerTQ = ray.remote(_DivOPDWorker)


class DivOPDAgentLoopManagerTQ(AgentLoopManagerTQ):
    """verl's TQ agent-loop manager with :data:`DivOPDAgentLoopWorkerTQ` workers. Under the DivOPD buffer's matched
    dispatch (:mod:`divopd.integrations.verl_dispatch`) it holds the training prompts verl submits and the buffer starts
    the sessions (:meth:`start_sessions`); other prompts are dispatched at once as verl does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = DivOPDAgentLoopWorkerTQ  # the workers start later, in create()
        self.dispatch: Any = None
        self._looked = False

    def generate_sequences(self, prompts: Any) -> None:
        if not self._looked:  # the first submission: link the buffer's dispatch (the config is final by now)
            self._looked = True
            self.dispatch = claim()
            if self.dispatch is not None:
                data = self.config.data
                self.dispatch.link(self, self.config.actor_rollout_ref.rollout.n,
                                   data.get("gen_batch_size", None) or data.train_batch_size)
        if self.dispatch is None or ("validate" in prompts.keys() and bool(prompts["validate"])):
            return super().generate_sequences(prompts)
        self.dispatch.hold(prompts)
        return None

    def start_sessions(self, prompts: Any) -> None:
        """Dispatch ``prompts`` to the workers now (verl's own dispatch of a batch)."""
        super().generate_sequences(prompts)
