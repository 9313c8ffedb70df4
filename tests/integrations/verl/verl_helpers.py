"""Shared pieces of the verl plug-in tests: the turn stream (a real divopd experience log), records into
TransferQueue, and the reference selection of ``divopd replay``."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import transfer_queue as tq

from divopd.analysis.replay import ReplayConfig
from divopd.analysis.replay_rules import deliveries, log_updates
from divopd.experience import Turn
from divopd.experience.log import ExperienceLogWriter, read_log
from divopd.integrations.verl import DivOPDReplayBuffer
from divopd.integrations.verl_records import SUMMARY_TAG, record_summary
from divopd.sampling import Ledger, make_sampler

#: The real experience log of a lockstep ``divopd train`` run (made by make_fixture.py, command in its docstring).
FIXTURE_LOG = Path(__file__).resolve().parent / "data" / "tiny-lockstep" / "experience"
#: The run's own settings (B, k, δ) and the plug-in's equivalent verl threshold (δ + 1).
SETTINGS: dict[str, Any] = {"batch_size": 6, "pool_factor": 4, "cap": 2, "max_staleness": 1}
THRESHOLD = SETTINGS["max_staleness"] + 1


def turn_to_record(turn: Turn, summary: bool = True) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(key, fields, tag)`` of a divopd turn in verl's layout (torch tensors), as a verl agent loop puts it.

    The teacher is verl's ``[prompt + response, 1]`` rows (row ``P − 1 + j`` scores response token ``j``, ids = the
    scored tokens, a dummy last row); a position the turn's ``teacher_valid_mask`` excludes is NaN; a turn without a
    prompt gets one value per response token. Absent arrays stay absent fields. ``summary``: add divopd's summary tag.
    """
    import torch

    prompt, response = np.asarray(turn.prompt_ids), np.asarray(turn.response_ids)
    p, n = len(prompt), len(response)
    fields: dict[str, Any] = {
        "prompts": torch.tensor(prompt, dtype=torch.int64),
        "responses": torch.tensor(response, dtype=torch.int64),
        "response_mask": torch.tensor(
            np.ones(n, dtype=np.int64) if turn.action_mask is None else turn.action_mask.astype(np.int64)),
    }
    if turn.student_logprobs is not None:
        fields["rollout_log_probs"] = torch.tensor(turn.student_logprobs, dtype=torch.float32)
    if turn.teacher_logprobs is not None:
        teacher = np.array(turn.teacher_logprobs, dtype=np.float32)
        if turn.teacher_valid_mask is not None and len(turn.teacher_valid_mask) == len(teacher):
            teacher[~turn.teacher_valid_mask] = np.nan
        if p == 0 or len(teacher) != n:
            fields["teacher_logprobs"] = torch.tensor(teacher)
        else:
            rows = np.zeros(p + n, dtype=np.float32)
            rows[p - 1:p - 1 + n] = teacher
            ids = np.concatenate([prompt[1:], response, [0]])
            fields["teacher_logprobs"] = torch.tensor(rows[:, None])
            fields["teacher_ids"] = torch.tensor(ids[:, None], dtype=torch.int32)
    tag: dict[str, Any] = {
        "status": "success", "prompt_len": p, "response_len": n, "seq_len": p + n,
        "global_steps": turn.policy_version, "min_global_steps": turn.policy_version,
        "max_global_steps": turn.policy_version, "prompt_truncated": turn.prompt_truncated,
        **{name: turn.info[name] for name in ("task", "env", "success") if turn.info.get(name) is not None},
    }
    key = f"{turn.rollout_id}_{turn.turn_index}"
    if summary:
        tag[SUMMARY_TAG] = record_summary(key, tag, fields)[1]
    return key, fields, tag


def damaged(turn: Turn, arrival: int) -> Turn:
    """Every 13th turn loses its teacher scores, every 17th its student log probs: invalid records in the stream."""
    if arrival % 13 == 5:
        return dataclasses.replace(turn, teacher_logprobs=None, teacher_valid_mask=None)
    if arrival % 17 == 3:
        return dataclasses.replace(turn, student_logprobs=None)
    return turn


def stream_log(tmp: Path) -> Path:
    """The fixture log with some records damaged (:func:`damaged`), written as a divopd log ``divopd replay`` reads."""
    out = tmp / "stream.parquet"
    with ExperienceLogWriter(out) as writer:
        for turn, arrival, update in read_log(FIXTURE_LOG):
            writer.append(damaged(turn, arrival), arrival_update=update, arrival=arrival)
    return out


def ticks(log: Path) -> list[list[Turn]]:
    """Replay's delivery rule: the turns added before tick j, for every tick of the log."""
    return [[t.turn for t in batch] for _, batch in deliveries(read_log(log), log_updates(log))]


def replay_config(method: str) -> ReplayConfig:
    return ReplayConfig(methods=(method,), **SETTINGS)


def reference_batches(log: Path, method: str) -> list[list[tuple[str, int]] | None]:
    """Per tick, the ``(rollout_id, turn_index)`` keys divopd replay's sampler selects (None = starved)."""
    sampler = make_sampler(replay_config(method).sampler_config(method))
    out = []
    for j, turns in enumerate(ticks(log)):
        sampler.add(turns)
        batch = sampler.next_batch(j)
        out.append(None if batch is None else [t.key for t in batch.payloads])
    return out


def new_partition() -> str:
    return f"divopd-{uuid.uuid4().hex[:12]}"


def put_turns(partition_id: str, turns: list[Turn], prompt_uid: str | None = None) -> list[str]:
    """Put turns as verl records (one ``kv_put`` each, fields as verl's agent loop writes them), then, like verl's
    rollout side, the prompt marker's terminal status after its trajectories."""
    keys = []
    for turn in turns:
        key, fields, tag = turn_to_record(turn)
        tq.kv_put(key=key, partition_id=partition_id, fields=fields, tag=tag)
        keys.append(key)
    if prompt_uid is not None:
        tq.kv_put(key=prompt_uid, partition_id=partition_id,
                  tag={"is_prompt": True, "status": "finished", "global_steps": 0})
    return keys


def trajectory_keys(partition_id: str) -> set[str]:
    listing = (tq.kv_list(partition_id=partition_id) or {}).get(partition_id, {})
    return {k for k, tag in listing.items() if not tag.get("is_prompt", False)}


def prompt_keys(partition_id: str) -> set[str]:
    listing = (tq.kv_list(partition_id=partition_id) or {}).get(partition_id, {})
    return {k for k, tag in listing.items() if tag.get("is_prompt", False)}


def clear_partition(partition_id: str) -> None:
    keys = list((tq.kv_list(partition_id=partition_id) or {}).get(partition_id, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition_id)


def make_buffer(method: str, **kwargs: Any) -> DivOPDReplayBuffer:
    """The plug-in as verl's ``_build_replay_buffer`` constructs a custom sampler (same keyword arguments)."""
    sampler_kwargs = {"method": method, "cap": SETTINGS["cap"], "pool_factor": SETTINGS["pool_factor"], **kwargs}
    return DivOPDReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=THRESHOLD,
                              max_off_policy_strategy="drop", sampler_kwargs=sampler_kwargs, poll_interval=0.01,
                              refill_fn=None)


def ledger_identity(ledger: Ledger) -> bool:
    parts = ledger.selected + ledger.expired + ledger.invalid + ledger.pending + ledger.queued
    return ledger.received == parts
