"""Trinity-RFT ``Experience`` records as divopd sees them, and as Trinity's trainer may receive them.

* :func:`experience_to_turn`: the :class:`divopd.Turn` of one experience (one student turn): ``eid.rid`` the rollout,
  ``eid.step`` the turn, the policy version, ``tokens[prompt_length:]`` the response with ``action_mask``, ``logprobs``
  and ``teacher_logprobs``.
* :func:`policy_version`: the version that generated the turn. Trinity's ``WorkflowRunner.run_task`` overwrites
  ``info["model_version"]`` with the version at the *task's* start after the workflow returns, so divopd's workflows
  keep the version read before each turn's generate call under ``info["divopd_policy_version"]``
  (:data:`TURN_VERSION_KEY`), which wins; :func:`restore_model_version` puts it back into ``info["model_version"]``
  for Trinity's own metrics (``sample/model_version/*``).
* :func:`mask_unscored`: makes an experience safe for Trinity's stock ``on_policy_distill`` advantage, which computes
  ``kl_coef * (teacher - old) * response_mask`` without masking NaN (NaN * 0 is NaN): positions whose teacher log prob
  is not finite leave ``action_mask`` and carry the student's own log prob (a zero advantage) as a finite placeholder.
"""

from __future__ import annotations

from dataclasses import MISSING
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np
import torch
from trinity.common.experience import Experience

from divopd.errors import UsageError
from divopd.experience import Turn

__all__ = ["TURN_VERSION_KEY", "UNSCORED_KEY", "experience_to_turn", "experiences_to_turns", "mask_unscored",
           "policy_version", "read_turns", "restore_model_version"]

#: ``info`` key of the policy version that generated the turn (divopd's workflows set it; it beats model_version).
TURN_VERSION_KEY = "divopd_policy_version"
#: ``info`` key set True by divopd's workflows when the teacher could not score the turn at all (its teacher log
#: probs are then a finite placeholder under an all-False action mask; the gate counts it ``missing_teacher``).
UNSCORED_KEY = "divopd_unscored"
_WHO = "sample_strategy divopd"


_NATIVE = {np.int64: torch.int64, np.float32: torch.float32, bool: torch.bool}


def _numpy(tensor: Any, dtype: Any) -> np.ndarray | None:
    if tensor is None:
        return None
    if isinstance(tensor, torch.Tensor):
        if tensor.dtype == _NATIVE.get(dtype) and tensor.dim() == 1 and tensor.device.type == "cpu" \
                and not tensor.requires_grad:
            return tensor.numpy()  # a view: Turn copies nothing it does not convert
  # bf16 has no numpy form: go through float32
        if tensor.dtype == torch.bfloat16 or tensor.dtype == torch.float16:
            tensor = tensor.float()
        tensor = tensor.detach().cpu().numpy()
    return np.asarray(tensor, dtype=dtype).reshape(-1)


def _field_error(exp: Experience, what: str) -> UsageError:
    return UsageError(f"{_WHO}: experience {exp.eid} {what}; DivOPD selects per turn and needs the rollout id "
                      "(eid.batch/eid.task/eid.run), the turn index (eid.step) and info['model_version'] on every "
                      "experience (docs/integrations/trinity.md)")


def policy_version(exp: Experience) -> Any:
    """The version that generated ``exp``: ``info["divopd_policy_version"]`` where a divopd workflow set it, else
    ``info["model_version"]`` (unchecked: :func:`experience_to_turn` checks it)."""
    info = exp.info or {}
    return info.get(TURN_VERSION_KEY, info.get("model_version"))


def restore_model_version(exp: Experience) -> None:
    """Put the turn's own version back into ``info["model_version"]`` (Trinity's runner wrote the task's start)."""
    if exp.info and TURN_VERSION_KEY in exp.info:
        exp.info["model_version"] = exp.info[TURN_VERSION_KEY]


def experience_to_turn(exp: Experience) -> Turn:
    """The :class:`divopd.Turn` of one Trinity experience (one student turn); its content is judged by the gate.

    Raises :class:`UsageError` (one line naming the field) when the record has no rollout id or no model version.
    """
    eid = exp.eid
    if eid is None or (eid.batch in ("", None) and eid.task in ("", None)):
        raise _field_error(exp, "has no rollout id (eid.batch and eid.task are empty)")
    version = policy_version(exp)
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
        raise _field_error(exp, f"has no usable info['model_version'] (got {version!r})")
    tokens = _numpy(exp.tokens, np.int64)
    if tokens is None:
        raise _field_error(exp, "has no tokens")
    prompt_length = int(exp.prompt_length)
    info = exp.info or {}
    turn_info = {"task": info.get("task", eid.tid)}
    if info.get("success") is not None:
        turn_info["success"] = bool(info["success"])
    try:
        return Turn(
            rollout_id=eid.rid,
            turn_index=eid.step,
            policy_version=int(version),
            prompt_ids=tokens[:prompt_length],
            response_ids=tokens[prompt_length:],
            action_mask=_numpy(exp.action_mask, bool),
            student_logprobs=_numpy(exp.logprobs, np.float32),
            teacher_logprobs=None if info.get(UNSCORED_KEY) else _numpy(exp.teacher_logprobs, np.float32),
            prompt_truncated=exp.truncate_status == "prompt_truncated",
            info=turn_info,
        )
    except ValueError as exc:  # a negative eid.step, a field that is not a 1-d sequence
        raise _field_error(exp, f"cannot be read as a turn ({exc})") from None


def mask_unscored(exp: Experience) -> int:
    """Make ``exp`` finite for Trinity's stock OPD advantage and losses; returns how many *action* positions left the
    mask because the teacher did not score them (a NaN or infinite teacher log prob).

    Such a position gets ``action_mask`` False and, as teacher log prob, the student's own log prob there (0 where
    that is not finite either): ``teacher - old`` is then 0 even for a reader that ignores the mask."""
    teacher = exp.teacher_logprobs
    if teacher is None:
        return 0
    teacher = torch.as_tensor(teacher)
    unscored = ~torch.isfinite(teacher)
    if not bool(unscored.any()):
        return 0
    n = teacher.shape[0]
    mask = torch.ones(n, dtype=torch.bool) if exp.action_mask is None else torch.as_tensor(exp.action_mask).bool()
    if mask.shape[0] != n:  # the gate rejects a length mismatch: never selected
        raise ValueError(f"mask_unscored: action_mask has {mask.shape[0]} positions, teacher_logprobs {n}")
    fill = torch.zeros(n, dtype=teacher.dtype)
    if exp.logprobs is not None and len(exp.logprobs) == n:
        student = torch.as_tensor(exp.logprobs).to(teacher.dtype)
        fill = torch.where(torch.isfinite(student), student, fill)
    masked = int((unscored & mask).sum())
    exp.teacher_logprobs = torch.where(unscored, fill, teacher)
    exp.action_mask = mask & ~unscored
    return masked


def experiences_to_turns(experiences: list[Experience]) -> list[Turn | UsageError]:
    """:func:`experience_to_turn` of each record, in order (a record that stops the run gives its
    :class:`UsageError` in its place), read in a few array operations over the whole read (:func:`read_turns`)."""
    return read_turns(experiences)[0]


def read_turns(experiences: list[Experience]) -> tuple[list[Turn | UsageError], list[bool]]:
    """:func:`experiences_to_turns` and, per record, whether its turn has a teacher position that is not finite
    (what :func:`mask_unscored` will mask at hand-over; False for a record that stops the run).

    The common record (1-d CPU tensors: integer ``tokens``, float ``logprobs`` and ``teacher_logprobs``, a bool
    ``action_mask``, all of the response's length, and a non-empty response) is read on a fast path: the per-token
    arrays of the whole read are concatenated once, each turn's arrays are views into them, and the values the gate,
    the focus score and the batch statistics read (``length_mismatch``, ``valid_mask``, ``n_valid``,
    ``disagreement``, ``kl_tokens``) are computed with a few array operations for all of them, equal to those
    :class:`Turn` computes itself (the disagreement is summed over the same compacted values by the same numpy
    reduction, so the rules rank exactly as :func:`experience_to_turn`'s turns rank). Any other record goes through
    :func:`experience_to_turn`."""
    out: list[Turn | UsageError | None] = [None] * len(experiences)
    fast: list[tuple[int, Experience, dict[str, Any]]] = []
    for i, exp in enumerate(experiences):
        head = _fast_head(exp)
        if head is not None:
            fast.append((i, exp, head))
            continue
        try:
            out[i] = experience_to_turn(exp)
        except UsageError as exc:
            out[i] = exc
    unscored = [isinstance(turn, Turn) and _has_nonfinite(turn) for turn in out]
    _precompute([t for t in out if isinstance(t, Turn)])
    if fast:
        try:
            turns, masked = _fast_turns(fast)
        except _NotFast:
            turns, masked = [experience_to_turn(exp) for _, exp, _ in fast], None
            _precompute(turns)
        for k, ((i, _, _), turn) in enumerate(zip(fast, turns, strict=True)):
            out[i] = turn
            unscored[i] = _has_nonfinite(turn) if masked is None else masked[k]
    return out, unscored  # type: ignore[return-value]  (every slot is filled)


def _has_nonfinite(turn: Turn) -> bool:
    return turn.teacher_logprobs is not None and not bool(np.isfinite(turn.teacher_logprobs).all())


_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_INTS = (torch.int64, torch.int32)
#: Turn's fields with their defaults, for turns assembled on the fast path (a field Turn gains is set to its default)
_TURN_DEFAULTS: dict[str, Any] = {f.name: None if f.default is MISSING else f.default for f in dataclass_fields(Turn)}


def _fast_head(exp: Experience) -> dict[str, Any] | None:
    """The scalar fields of ``exp``'s turn when the record qualifies for the fast path of :func:`read_turns`, else
    ``None`` (then :func:`experience_to_turn` reads it, and raises for a record that stops the run). The device and
    ``requires_grad`` of the tensors are checked on their concatenation (:func:`_fast_turns`)."""
    eid, info = exp.eid, exp.info
    if eid is None or type(info) is not dict or info.get(UNSCORED_KEY):
        return None
    step = eid.step
    if (eid.batch in ("", None) and eid.task in ("", None)) or type(step) is not int or step < 0:
        return None
    version = info.get(TURN_VERSION_KEY, info.get("model_version"))
    prompt_length = exp.prompt_length
    if type(version) is not int or version < 0 or type(prompt_length) is not int or prompt_length < 0:
        return None
    tokens, student, teacher, mask = exp.tokens, exp.logprobs, exp.teacher_logprobs, exp.action_mask
    if type(tokens) is not torch.Tensor or type(student) is not torch.Tensor or type(teacher) is not torch.Tensor \
            or type(mask) is not torch.Tensor:
        return None
    if tokens.dtype not in _INTS or mask.dtype is not torch.bool or student.dtype not in _FLOATS \
            or teacher.dtype not in _FLOATS or tokens.dim() != 1 or student.dim() != 1 or teacher.dim() != 1 \
            or mask.dim() != 1:
        return None
    n = tokens.shape[0] - prompt_length
    if n <= 0 or student.shape[0] != n or teacher.shape[0] != n or mask.shape[0] != n:
        return None
    task = info.get("task")
    turn_info = {"task": eid.tid if task is None and "task" not in info else task}
    success = info.get("success")
    if success is not None:
        turn_info["success"] = bool(success)
    return {**_TURN_DEFAULTS, "rollout_id": eid.rid, "turn_index": step, "policy_version": version,
            "prompt_truncated": exp.truncate_status == "prompt_truncated", "info": turn_info}


def _fast_turns(fast: list[tuple[int, Experience, dict[str, Any]]]) -> tuple[list[Turn], list[bool]]:
    """The turns of the fast-path records of one read, and whether each has a teacher position that is not finite."""
    exps = [exp for _, exp, _ in fast]
    tokens = _cat([e.tokens for e in exps]).numpy().astype(np.int32)  # Turn's ids are int32
    student = _cat([e.logprobs for e in exps]).to(torch.float32).numpy()
    teacher = _cat([e.teacher_logprobs for e in exps]).to(torch.float32).numpy()
    action = _cat([e.action_mask for e in exps]).numpy()
    prompts = np.fromiter((e.prompt_length for e in exps), dtype=np.int64, count=len(exps))
    lengths = np.fromiter((e.tokens.shape[0] for e in exps), dtype=np.int64, count=len(exps)) - prompts
    starts, ends, valid, n_valid, kl, disagreement = _cached_values(student, teacher, action, lengths)
    masked = (np.add.reduceat(~np.isfinite(teacher), starts, dtype=np.int64) > 0).tolist()
    token_starts = (np.cumsum(prompts + lengths) - prompts - lengths).tolist()
    turns, new = [], Turn.__new__
    for (_, _, head), s, e, t, p, nv, k, d in zip(fast, starts, ends, token_starts, prompts.tolist(), n_valid, kl,
                                                  disagreement, strict=True):
        head.update(  # every field in Turn's own form, nothing left to convert
            prompt_ids=tokens[t:t + p], response_ids=tokens[t + p:t + p + e - s], action_mask=action[s:e],
            student_logprobs=student[s:e], teacher_logprobs=teacher[s:e],
            # Turn's cached values (functools.cached_property keeps them in the instance dict)
            length_mismatch=None, valid_mask=valid[s:e], n_valid=nv, kl_tokens=k, disagreement=d)
        turn = new(Turn)
        turn.__dict__ = head
        turns.append(turn)
    return turns, masked


class _NotFast(Exception):
    """A read whose tensors cannot be concatenated on the CPU without autograd: it takes the per-record path."""


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    try:
        out = torch.cat(tensors)
    except RuntimeError:  # tensors on different devices
        raise _NotFast from None
    if out.device.type != "cpu" or out.requires_grad:
        raise _NotFast
    return out


def _segment_sums(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per segment (consecutive runs of ``counts`` values), ``values[segment].sum()`` exactly as numpy sums a 1-d
    array: the segments of one length are summed as the rows of one C-contiguous 2-d array (numpy reduces each row
    as it reduces a 1-d array), one reduction per distinct length."""
    out = np.zeros(counts.shape[0], dtype=np.float64)
    starts = np.cumsum(counts) - counts
    for k in np.unique(counts).tolist():
        if k == 0:
            continue
        rows = np.flatnonzero(counts == k)
        out[rows] = values[starts[rows][:, None] + np.arange(k)].sum(axis=1)
    return out


def _cached_values(student: np.ndarray, teacher: np.ndarray, action: np.ndarray,
                   lengths: np.ndarray) -> tuple[list[int], list[int], np.ndarray, list[int], list[int], list[float]]:
    """For turns whose response arrays are concatenated (``lengths`` each): their ``starts`` and ``ends`` in the
    concatenation, the concatenated ``valid_mask``, and per turn ``n_valid``, ``kl_tokens`` and ``disagreement``
    (0 / 0.0 for a turn without a valid token), equal to what :class:`Turn` computes for each on its own."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    valid = np.isfinite(teacher) & action  # Turn.valid_mask
    both = valid & np.isfinite(student)  # the positions Turn.disagreement sums over
    n_valid = np.add.reduceat(valid, starts, dtype=np.int64)
    kl = np.add.reduceat(both, starts, dtype=np.int64)  # 0 where n_valid is 0 (no valid position, none of both)
    disagreement = _segment_sums(np.subtract(student, teacher, dtype=np.float64)[both], kl)
    return (starts.tolist(), ends.tolist(), valid, n_valid.tolist(), kl.tolist(), disagreement.tolist())


def _precompute(turns: list[Turn]) -> None:
    """Fill the cached ``length_mismatch``, ``valid_mask``, ``n_valid`` and ``disagreement`` of ``turns`` whose
    per-token arrays all have the response's length; the values are those :class:`Turn` computes itself (same masks,
    the same float64 differences summed over the same positions in the same order). Other turns are left to Turn."""
    ok = [t for t in turns if t.response_len > 0 and t.teacher_valid_mask is None and t.teacher_topk_ids is None
          and t.teacher_topk_logprobs is None and t.action_mask is not None and t.student_logprobs is not None
          and t.teacher_logprobs is not None
          and t.action_mask.shape[0] == t.student_logprobs.shape[0] == t.teacher_logprobs.shape[0] == t.response_len]
    if not ok:
        return
    lengths = np.fromiter((t.response_len for t in ok), dtype=np.int64, count=len(ok))
    starts, ends, valid, n_valid, kl, disagreement = _cached_values(
        np.concatenate([t.student_logprobs for t in ok]), np.concatenate([t.teacher_logprobs for t in ok]),
        np.concatenate([t.action_mask for t in ok]), lengths)
    for turn, start, end, n, k, d in zip(ok, starts, ends, n_valid, kl, disagreement, strict=True):
        cached = turn.__dict__  # functools.cached_property's own slots
        cached["length_mismatch"] = None
        cached["valid_mask"] = valid[start:end]
        cached["n_valid"] = n
        cached["kl_tokens"] = k
        cached["disagreement"] = d
