"""verl TransferQueue records ⇄ divopd turns (the record side of :mod:`divopd.integrations.verl`).

A verl v1 agent loop puts one record per agent-loop output into TransferQueue under the key
``{uid}_{session_id}_{index}`` (``verl/trainer/ppo/v1/agent_loop_tq.py``). For per-turn selection each output is one
student turn, so the rollout is ``{uid}_{session_id}`` and the turn index is ``index``: :func:`parse_key` splits the key
at its last ``_``. A record becomes a :class:`~divopd.experience.Turn` from:

- fields ``prompts`` and ``responses`` (token ids), ``response_mask`` (1 = a token the student generated: the action
  mask), ``rollout_log_probs`` (the generating policy's log probs, verl's name for ``response_logprobs``),
  ``teacher_logprobs`` with optional ``teacher_ids`` (verl's teacher loop: ``[prompt + response, K]`` rows and ids;
  also accepted: one value per response token, ``[response]`` or ``[response, 1]``);
- tags ``min_global_steps`` (the weights version that started the turn; a ``policy_version`` tag wins when both are
  there), optional ``prompt_truncated``, ``task``, ``env``, ``success``.

What the composer needs but a record may lack: a record without a parsable key or without a version cannot become a
turn and raises :class:`VerlRecordError` (one line naming the key and the field); a record without teacher or student
log probs, or with a per-token field of another length than ``responses``, becomes a turn that divopd's gate rejects
with its reason (``missing_teacher``, ``missing_student_logprobs``, ``length_mismatch``), counted in the ledger.
The teacher log prob of a response token is the one whose ``teacher_ids`` entry is that token; a position where no
column holds the token is unscored (NaN), as divopd's gate reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from divopd.errors import UsageError
from divopd.experience import Turn

__all__ = ["RECORD_FIELDS", "VerlRecordError", "parse_key", "record_to_turn", "turn_to_record"]

#: The value fields the plug-in reads from a record (others, e.g. ``input_ids``, are left to verl).
RECORD_FIELDS: tuple[str, ...] = (
    "prompts", "responses", "response_mask", "rollout_log_probs", "teacher_logprobs", "teacher_ids")
_INFO_TAGS = ("task", "env", "success")


class VerlRecordError(UsageError):
    """A TransferQueue record the composer cannot place (no rollout id / turn index, no version, no token ids)."""


def parse_key(key: str) -> tuple[str, int]:
    """``(rollout_id, turn_index)`` of a ``{uid}_{session_id}_{index}`` key (split at the last ``_``)."""
    head, sep, tail = str(key).rpartition("_")
    if not sep or not head or not tail.isdigit():
        raise VerlRecordError(
            f"verl record {key!r}: no rollout id / turn index: per-turn selection needs keys "
            "'{uid}_{session_id}_{turn_index}' (one agent-loop output per turn)")
    return head, int(tail)


def _policy_version(key: str, tag: Mapping[str, Any]) -> int:
    for name in ("policy_version", "min_global_steps"):
        value = tag.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise VerlRecordError(f"verl record {key!r}: tag {name}={value!r} is not a version (an int >= 0)")
            return int(value)
    raise VerlRecordError(
        f"verl record {key!r}: no policy version: its tag needs min_global_steps (the weights version that "
        "generated the turn; verl's LLM server sets it) or policy_version")


def _array(value: Any, dtype: Any) -> np.ndarray | None:
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=dtype)


def _teacher_per_token(logprobs: np.ndarray | None, ids: np.ndarray | None, prompt_len: int,
                       responses: np.ndarray) -> np.ndarray | None:
    """One teacher log prob per response token (NaN where the token is not among the scored ids)."""
    if logprobs is None:
        return None
    lp = logprobs.reshape(len(logprobs), -1) if logprobs.ndim != 2 else logprobs
    ids2 = None if ids is None else ids.reshape(len(ids), -1)
    n = len(responses)
    if lp.shape[0] == prompt_len + n:
        lp = lp[prompt_len:]
        ids2 = None if ids2 is None or ids2.shape[0] != prompt_len + n else ids2[prompt_len:]
    elif lp.shape[0] != n:
        return lp[:, 0]  # another length: the gate names it (length_mismatch)
    if ids2 is None or ids2.shape != lp.shape:
        return lp[:, 0]
    hit = ids2 == responses[:, None]
    first = hit.argmax(axis=1)
    out = lp[np.arange(n), first].astype(np.float32)
    out[~hit.any(axis=1)] = np.nan
    return out


def record_to_turn(key: str, tag: Mapping[str, Any], values: Mapping[str, Any]) -> Turn:
    """The turn of one TransferQueue record (``values``: its fields, absent ones missing or ``None``)."""
    rollout_id, turn_index = parse_key(key)
    version = _policy_version(key, tag)
    responses = _array(values.get("responses"), np.int64)
    prompts = _array(values.get("prompts"), np.int64)
    for name, arr in (("responses", responses), ("prompts", prompts)):
        if arr is None or arr.ndim != 1:
            raise VerlRecordError(f"verl record {key!r}: field {name!r} missing or not 1-d token ids")
    teacher = _teacher_per_token(_array(values.get("teacher_logprobs"), np.float32),
                                 _array(values.get("teacher_ids"), np.int64), len(prompts), responses)
    info = {name: tag[name] for name in _INFO_TAGS if tag.get(name) is not None}
    info["verl_key"] = key
    return Turn(
        rollout_id=rollout_id,
        turn_index=turn_index,
        policy_version=version,
        prompt_ids=prompts,
        response_ids=responses,
        action_mask=_array(values.get("response_mask"), bool),
        student_logprobs=_array(values.get("rollout_log_probs"), np.float32),
        teacher_logprobs=teacher,
        prompt_truncated=bool(tag.get("prompt_truncated", False)),
        info=info,
    )


def turn_to_record(turn: Turn) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(key, fields, tag)`` of a divopd turn in verl's layout (torch tensors), as an agent loop would put it.

    The teacher row is ``[prompt + response, 1]`` with ``teacher_ids`` = the sequence, like verl's teacher loop; a
    position the turn's ``teacher_valid_mask`` excludes is NaN. Absent arrays stay absent fields.
    """
    import torch

    prompt, response = np.asarray(turn.prompt_ids), np.asarray(turn.response_ids)
    fields: dict[str, Any] = {
        "prompts": torch.tensor(prompt, dtype=torch.int64),
        "responses": torch.tensor(response, dtype=torch.int64),
        "response_mask": torch.tensor(
            np.ones(len(response), dtype=np.int64) if turn.action_mask is None else turn.action_mask.astype(np.int64)),
    }
    if turn.student_logprobs is not None:
        fields["rollout_log_probs"] = torch.tensor(turn.student_logprobs, dtype=torch.float32)
    if turn.teacher_logprobs is not None:
        teacher = np.array(turn.teacher_logprobs, dtype=np.float32)
        if turn.teacher_valid_mask is not None and len(turn.teacher_valid_mask) == len(teacher):
            teacher[~turn.teacher_valid_mask] = np.nan
        rows = np.concatenate([np.zeros(len(prompt), dtype=np.float32), teacher])
        fields["teacher_logprobs"] = torch.tensor(rows[:, None])
        fields["teacher_ids"] = torch.tensor(np.concatenate([prompt, response])[:len(rows), None], dtype=torch.int64)
    tag: dict[str, Any] = {
        "status": "success", "prompt_len": len(prompt), "response_len": len(response),
        "seq_len": len(prompt) + len(response), "global_steps": turn.policy_version,
        "min_global_steps": turn.policy_version, "max_global_steps": turn.policy_version,
        "prompt_truncated": turn.prompt_truncated,
        **{name: turn.info[name] for name in _INFO_TAGS if turn.info.get(name) is not None},
    }
    return f"{turn.rollout_id}_{turn.turn_index}", fields, tag
