"""The rollout-side piece: a verl session output split into one record per assistant turn, written into
the real TransferQueue by verl's own TQ worker code, and read back by the plug-in as turns of one rollout.

The worker's servers (LLM, teacher, reward) do not run on a CPU here: ``_Host`` stands in for the worker instance
(the teacher's scores are made up); the record-writing code is verl's ``AgentLoopWorkerTQ._agent_loop_postprocess``
and the split/score step is the plug-in's override, both unmodified.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import torch  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl_helpers import clear_partition, make_buffer, new_partition  # noqa: E402

from divopd.integrations.verl_agent_loop import (  # noqa: E402
    DivOPDAgentLoopManagerTQ,
    _DivOPDWorker,
    split_turns,
    turn_spans,
)

PROMPT = [101, 102, 103]
# three assistant turns (mask 1) with tool/user tokens between them (mask 0)
RESPONSE = [11, 12, 90, 91, 21, 22, 23, 92, 31]
MASK = [1, 1, 0, 0, 1, 1, 1, 0, 1]
LOGPROBS = [-0.1, -0.2, 0.0, 0.0, -0.3, -0.4, -0.5, 0.0, -0.6]


def _session(**over: object) -> AgentLoopOutput:
    data = dict(prompt_ids=PROMPT, response_ids=RESPONSE, response_mask=MASK, response_logprobs=LOGPROBS,
                reward_score=1.0, num_turns=6, metrics=AgentLoopMetrics(),
                extra_fields={"min_global_steps": 4, "max_global_steps": 5})
    data.update(over)
    return AgentLoopOutput(**data)


def test_a_session_splits_into_one_output_per_assistant_turn() -> None:
    assert turn_spans(MASK) == [(0, 2), (4, 7), (8, 9)]
    turns = split_turns(_session())
    assert [t.response_ids for t in turns] == [[11, 12], [21, 22, 23], [31]]
    assert [t.prompt_ids for t in turns] == [PROMPT, PROMPT + [11, 12, 90, 91], PROMPT + RESPONSE[:8]]
    assert [t.response_logprobs for t in turns] == [[-0.1, -0.2], [-0.3, -0.4, -0.5], [-0.6]]
    assert all(t.response_mask == [1] * len(t.response_ids) for t in turns)
    assert [t.extra_fields["turn_index"] for t in turns] == [0, 1, 2]
    assert all(t.extra_fields["min_global_steps"] == 4 for t in turns)
    assert [t.reward_score for t in turns] == [None, None, 1.0]
    single = _session(response_ids=[5, 6], response_mask=[1, 1], response_logprobs=[-1.0, -1.0])
    assert split_turns(single) == [single]


class _Host:
    """Stands in for a worker instance: a made-up teacher score per token, the reward given, text only."""

    distillation_enabled = True

    async def _compute_score(self, outputs, kwargs) -> None:  # the reward is already on the output
        outputs[-1].extra_fields.setdefault("reward_extra_info", {})

    async def _compute_teacher_logprobs(self, output, prompt_ids, response_ids, validate, sample_kwargs=None) -> None:
        # verl's layout (vLLM prompt log probs): row i scores sequence token i + 1, the last row a dummy
        ids = torch.tensor((prompt_ids + response_ids)[1:] + [0], dtype=torch.int32).unsqueeze(1)
        output.extra_fields["teacher_ids"] = ids
        output.extra_fields["teacher_logprobs"] = torch.full(ids.shape, -1.0)

    def _compute_multi_modal_inputs(self, output, input_ids) -> dict:
        return {}

    def _compute_position_ids(self, input_ids, attention_mask, multi_modal_inputs) -> torch.Tensor:
        return torch.arange(input_ids.shape[1]).unsqueeze(0)


class _Worker(_DivOPDWorker):  # the plug-in's override on top of verl's TQ worker, without its __init__
    def __init__(self) -> None:
        host = _Host()
        for name in ("distillation_enabled", "_compute_score", "_compute_teacher_logprobs",
                     "_compute_multi_modal_inputs", "_compute_position_ids"):
            setattr(self, name, getattr(host, name))


def test_verls_tq_worker_writes_one_scored_record_per_turn_and_the_plugin_reads_them(transfer_queue) -> None:
    assert DivOPDAgentLoopManagerTQ.__mro__[1].__name__ == "AgentLoopManagerTQ"
    partition = new_partition()
    worker = _Worker()
    try:
        asyncio.run(worker._agent_loop_postprocess(_session(), validate=False, uid="u1", session_id=0,
                                                   global_steps=5))
        # verl's postprocess writes to "train"; move its records into this test's partition
        listing = transfer_queue.kv_list(partition_id="train")["train"]
        keys = sorted(k for k in listing if k.startswith("u1_0_"))
        assert keys == ["u1_0_0", "u1_0_1", "u1_0_2"]
        data = transfer_queue.kv_batch_get(keys=keys, partition_id="train")
        for i, key in enumerate(keys):
            fields = {f: data[f][i] for f in ("prompts", "responses", "response_mask", "rollout_log_probs",
                                               "teacher_logprobs", "teacher_ids")}
            transfer_queue.kv_put(key=key, partition_id=partition, fields=fields, tag=listing[key])
        transfer_queue.kv_clear(keys=keys, partition_id="train")
        rb = make_buffer("divopd")
        rb._ensure_sampler(6)
        turns = rb.ingest(partition)
        assert [(t.rollout_id, t.turn_index, t.policy_version) for t in turns] == [("u1_0", i, 4) for i in range(3)]
        assert [t.n_valid for t in turns] == [2, 3, 1]
        assert turns[1].disagreement == pytest.approx((-0.3 + 1) + (-0.4 + 1) + (-0.5 + 1))
        assert rb.sampler.ledger.received == 3 and rb.sampler.ledger.invalid == 0
    finally:
        clear_partition(partition)
