"""verl TransferQueue records ⇄ divopd turns (the record side of :mod:`divopd.integrations.verl`).

A record is one student turn under the key ``{uid}_{session_id}_{turn_index}`` (rollout ``{uid}_{session_id}``).
Its teacher comes in verl's ``[prompt + response, K]`` rows (row ``P − 1 + j`` scores response token ``j``; the value
whose ``teacher_ids`` entry is the token, none = unscored, NaN) or one value per response token. A record without
a parsable key, a version or token ids raises :class:`VerlRecordError`; other faults are the gate's reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from divopd.errors import UsageError
from divopd.experience import Turn
from divopd.sampling import Candidate
from divopd.sampling.candidate import task_key
from divopd.sampling.gate import verdict

__all__ = ["RECORD_FIELDS", "SUMMARY_TAG", "VerlRecordError", "candidate_of", "parse_key", "record_summary",
           "safe_fields"]

_FIELD_TYPES = {"prompts": np.int64, "responses": np.int64, "response_mask": np.int64,
                "rollout_log_probs": np.float32, "teacher_logprobs": np.float32, "teacher_ids": np.int64}
#: The value fields the plug-in reads from a record (others, e.g. ``input_ids``, are left to verl).
RECORD_FIELDS: tuple[str, ...] = tuple(_FIELD_TYPES)
#: The tag holding divopd's per-turn summary (see :func:`record_summary`).
SUMMARY_TAG = "divopd"
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


def _teacher_rows(logprobs: np.ndarray | None, ids: np.ndarray | None, prompt_len: int, n: int
                  ) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """The teacher rows of the ``n`` response tokens, ``[n, K]`` values and ids (ids ``None`` when absent), and the
    layout: ``sequence`` (verl's ``[P + R, K]``), ``response`` (one row per response token) or ``other``."""
    if logprobs is None:
        return None, None, "none"
    lp = logprobs.reshape(len(logprobs), -1) if logprobs.ndim != 2 else logprobs
    ids2 = None if ids is None else ids.reshape(len(ids), -1)
    if ids2 is not None and ids2.shape != lp.shape:
        ids2 = None
    if lp.shape[0] == prompt_len + n and prompt_len > 0:
        rows = slice(prompt_len - 1, prompt_len - 1 + n)
        return lp[rows], None if ids2 is None else ids2[rows], "sequence"
    if lp.shape[0] == n:
        return lp, ids2, "response"
    return lp, ids2, "other"


def _per_token(rows: np.ndarray, ids: np.ndarray | None, responses: np.ndarray) -> np.ndarray:
    """One teacher log prob per response token: the column whose id is the token (NaN where none is)."""
    if ids is None or rows.shape[0] != len(responses):
        return rows[:, 0].astype(np.float32)
    hit = ids == responses[:, None]
    out = rows[np.arange(len(responses)), hit.argmax(axis=1)].astype(np.float32)
    out[~hit.any(axis=1)] = np.nan
    return out


def _fields(values: Mapping[str, Any], key: str) -> dict[str, Any]:
    arrays = {name: _array(values.get(name), dtype) for name, dtype in _FIELD_TYPES.items()}
    for name in ("responses", "prompts"):
        if arrays[name] is None or arrays[name].ndim != 1:
            raise VerlRecordError(f"verl record {key!r}: field {name!r} missing or not 1-d token ids")
    return arrays


def record_summary(key: str, tag: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[Turn, dict[str, Any]]:
    """The turn of one TransferQueue record (``values``: its fields, absent ones missing or ``None``) and divopd's
    summary of it (the :data:`SUMMARY_TAG` tag): the scalars the composer reads, ``unscored`` (action positions whose
    teacher row is not finite) and ``rewrite`` (verl's losses cannot read the record before :func:`safe_fields`)."""
    rollout_id, turn_index = parse_key(key)
    version = _policy_version(key, tag)
    a = _fields(values, key)
    prompts, responses = a["prompts"], a["responses"]
    rows, ids, layout = _teacher_rows(a["teacher_logprobs"], a["teacher_ids"], len(prompts), len(responses))
    teacher = None if rows is None else _per_token(rows, ids, responses)
    mask = a["response_mask"]
    info = {name: tag[name] for name in _INFO_TAGS if tag.get(name) is not None}
    info["verl_key"] = key
    turn = Turn(
        rollout_id=rollout_id, turn_index=turn_index, policy_version=version, prompt_ids=prompts,
        response_ids=responses, action_mask=None if mask is None else mask.astype(bool),
        student_logprobs=a["rollout_log_probs"], teacher_logprobs=teacher,
        prompt_truncated=bool(tag.get("prompt_truncated", False)), info=info)
    unscored, nonfinite = 0, False
    if rows is not None and layout in ("sequence", "response") and turn.length_mismatch is None:
        bad = ~np.isfinite(rows).all(axis=1)
        acting = np.ones(len(responses), dtype=bool) if mask is None else mask.astype(bool)
        unscored = int(np.count_nonzero(bad & acting))
        nonfinite = not np.isfinite(a["teacher_logprobs"]).all()
    summary = {
        "response_len": turn.response_len, "length_mismatch": turn.length_mismatch,
        "teacher": turn.teacher_logprobs is not None, "student": turn.student_logprobs is not None,
        "n_valid": turn.n_valid, "disagreement": turn.disagreement, "kl_tokens": turn.kl_tokens,
        "teacher_masked": turn.teacher_masked_tokens, "unscored": unscored,
        "rewrite": bool(rows is not None and (nonfinite or unscored > 0 or layout == "response")),
    }
    return turn, summary


def candidate_of(key: str, tag: Mapping[str, Any]) -> Candidate:
    """The candidate of a record whose tag carries divopd's summary (no field is read); :class:`VerlRecordError` for
    a key or version it cannot place, or an incomplete summary."""
    rollout_id, turn_index = parse_key(key)
    version = _policy_version(key, tag)
    try:
        s = tag[SUMMARY_TAG]
        n, n_valid, truncated = int(s["response_len"]), int(s["n_valid"]), bool(tag.get("prompt_truncated", False))
        reason = verdict(truncated, n, bool(s["teacher"]), bool(s["student"]), s["length_mismatch"], n_valid)
        return Candidate(rollout_id, turn_index, version, n, n_valid, int(s["kl_tokens"]), float(s["disagreement"]),
                         reason, task_key(tag.get("task"), rollout_id))
    except (KeyError, TypeError, ValueError):
        raise VerlRecordError(f"verl record {key!r}: tag {SUMMARY_TAG!r} is incomplete") from None


def safe_fields(values: Mapping[str, Any], key: str) -> tuple[dict[str, Any], int]:
    """The fields to put back into a record before verl trains on it, and how many positions left its mask: the
    teacher in verl's ``[P + R, K]`` layout (one value per token becomes ``K = 1``), every non-finite teacher value the
    student's log prob at that position (no disagreement there; 0 elsewhere), and the action positions
    whose row was not finite out of ``response_mask`` and ``loss_mask``."""
    import torch

    a = _fields(values, key)
    prompts, responses = a["prompts"], a["responses"]
    p, n = len(prompts), len(responses)
    rows, ids, layout = _teacher_rows(a["teacher_logprobs"], a["teacher_ids"], p, n)
    if rows is None or layout not in ("sequence", "response") or p == 0:
        raise VerlRecordError(f"verl record {key!r}: teacher_logprobs of shape "
                              f"{None if a['teacher_logprobs'] is None else a['teacher_logprobs'].shape} cannot be "
                              f"put in verl's [prompt + response, K] layout ({p} + {n} tokens)")
    sequence = np.concatenate([prompts, responses])
    if layout == "sequence":
        table = a["teacher_logprobs"].reshape(p + n, -1).copy()
        id_table = a["teacher_ids"].reshape(p + n, -1) if a["teacher_ids"] is not None and \
            a["teacher_ids"].size == table.size else np.concatenate([sequence[1:], [0]])[:, None]
    else:
        table = np.zeros((p + n, 1), dtype=np.float32)
        table[p - 1:p - 1 + n, 0] = _per_token(rows, ids, responses)
        id_table = np.concatenate([sequence[1:], [0]])[:, None]
    student = a["rollout_log_probs"]
    fill = np.zeros(p + n, dtype=np.float32)
    if student is not None and len(student) == n:
        fill[p - 1:p - 1 + n] = np.where(np.isfinite(student), student, 0.0)
    bad_rows = ~np.isfinite(table).all(axis=1)
    table = np.where(np.isfinite(table), table, fill[:, None])
    mask = np.ones(n, dtype=np.int64) if a["response_mask"] is None else a["response_mask"].copy()
    dropped = bad_rows[p - 1:p - 1 + n] & (mask != 0)
    mask[dropped] = 0
    out = {
        "teacher_logprobs": torch.tensor(table, dtype=torch.float32),
        "teacher_ids": torch.tensor(id_table, dtype=torch.int32),
        "response_mask": torch.tensor(mask, dtype=torch.int64),
        "loss_mask": torch.tensor(mask, dtype=torch.int64),
    }
    return out, int(np.count_nonzero(dropped))
