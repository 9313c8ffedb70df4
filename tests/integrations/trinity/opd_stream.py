"""A divopd experience log as a Trinity-RFT turn stream, and the selections ``divopd replay`` makes on it.

:func:`to_experience` writes one logged turn as the ``Experience`` a per-turn OPD workflow emits (``eid.rid`` the
rollout, ``eid.step`` the turn, ``info["model_version"]``, ``tokens``/``prompt_length``, ``logprobs``,
``teacher_logprobs``, ``action_mask``). :func:`reference` runs divopd's own sampler over the same log the way
``divopd replay`` does (:func:`divopd.analysis.replay_rules.deliveries`: tick ``j`` delivers the turns with
``arrival_update <= j``, then asks for a batch at learner version ``j``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from trinity.common.experience import EID, Experience

from divopd.analysis.replay_rules import deliveries
from divopd.experience import Turn
from divopd.experience.log import read_log
from divopd.sampling import Ledger, Sampler, SamplerConfig, make_sampler

#: The sampler settings of the logged run and of every replay of its log (B, c, k, delta), and its updates.
SETTINGS = {"batch_size": 4, "pool_factor": 2, "cap": 2, "max_staleness": 2}
UPDATES = 8


@dataclass
class Tick:
    """One update of the replay: the turns delivered before it, and what divopd's sampler then selects."""

    update: int
    delivered: list[Turn]
    selected: list[tuple[str, int]] | None  # (rollout_id, turn_index) in composition order; None = starved
    ledger: Ledger


def damage(turn: Turn, arrival: int) -> Turn:
    """Every 9th turn loses its teacher scores, every 13th has a student log-prob array one token short: invalid
    records for the gate (``missing_teacher``, ``length_mismatch``) inside a real stream."""
    if arrival % 9 == 4:
        return replace(turn, teacher_logprobs=None)
    if arrival % 13 == 6 and turn.student_logprobs is not None:
        return replace(turn, student_logprobs=turn.student_logprobs[:-1])
    return turn


def reference(log: Path, config: SamplerConfig, updates: int, damaged: bool = False) -> tuple[list[Tick], Sampler]:
    """The replay's ticks over ``log`` for ``config`` (divopd.sampling's Sampler, replay's delivery rule)."""
    sampler = make_sampler(config)
    logged = [lt._replace(turn=damage(lt.turn, lt.arrival)) if damaged else lt for lt in read_log(log)]
    ticks = []
    for j, arrivals in deliveries(logged, updates):
        turns = [a.turn for a in arrivals]
        sampler.add(turns)
        batch = sampler.next_batch(j)
        selected = None if batch is None else [t.key for t in batch.payloads]
        ticks.append(Tick(j, turns, selected, sampler.ledger))
    return ticks, sampler


def rollout_ranks(log: Path) -> dict[str, int]:
    """Rollout id -> rank in string order: ``eid.task = f"{rank:06d}"`` keeps the order of the ids (the composer
    breaks ties between rollout groups by rollout id)."""
    return {rid: i for i, rid in enumerate(sorted({lt.turn.rollout_id for lt in read_log(log)}))}


def to_experience(turn: Turn, rank: int) -> Experience:
    """The Trinity ``Experience`` of one logged turn (teacher positions outside ``teacher_valid_mask`` become NaN)."""
    teacher = None
    if turn.teacher_logprobs is not None:
        teacher = np.array(turn.teacher_logprobs, dtype=np.float32)
        if turn.teacher_valid_mask is not None and len(turn.teacher_valid_mask) == len(teacher):
            teacher[~turn.teacher_valid_mask] = np.nan
        teacher = torch.from_numpy(teacher)
    mask = turn.action_mask if turn.action_mask is not None else np.ones(turn.response_len, dtype=bool)
    info = {"model_version": turn.policy_version, "divopd_key": list(turn.key)}
    if turn.info.get("task") is not None:
        info["task"] = turn.info["task"]
    return Experience(
        eid=EID(batch="log", task=f"{rank:06d}", run=0, step=turn.turn_index),
        tokens=torch.from_numpy(np.concatenate([turn.prompt_ids, turn.response_ids]).astype(np.int64)),
        prompt_length=turn.prompt_len,
        logprobs=None if turn.student_logprobs is None else torch.from_numpy(np.array(turn.student_logprobs)),
        teacher_logprobs=teacher,
        action_mask=torch.from_numpy(np.array(mask, dtype=bool)),
        truncate_status="prompt_truncated" if turn.prompt_truncated else None,
        info=info,
    )


def key_of(exp: Experience) -> tuple[str, int]:
    rid, index = exp.info["divopd_key"]
    return rid, int(index)
