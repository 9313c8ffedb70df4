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

from typing import Any

import numpy as np
import torch
from trinity.common.experience import Experience

from divopd.errors import UsageError
from divopd.experience import Turn

__all__ = ["TURN_VERSION_KEY", "UNSCORED_KEY", "experience_to_turn", "experiences_to_turns", "mask_unscored",
           "policy_version", "restore_model_version"]

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
    :class:`UsageError` in its place), with the gate's and the focus score's per-turn values computed for the whole
    read in a few array operations (:func:`_precompute`) instead of several small ones per turn."""
    out: list[Turn | UsageError] = []
    for exp in experiences:
        try:
            out.append(experience_to_turn(exp))
        except UsageError as exc:
            out.append(exc)
    _precompute([t for t in out if isinstance(t, Turn)])
    return out


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
    teacher = np.concatenate([t.teacher_logprobs for t in ok])
    student = np.concatenate([t.student_logprobs for t in ok])
    valid = np.isfinite(teacher) & np.concatenate([t.action_mask for t in ok])
    both = valid & np.isfinite(student)
    diff = np.subtract(student, teacher, out=np.zeros(teacher.shape[0]), dtype=np.float64, where=both)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    n_valid = np.add.reduceat(valid, starts, dtype=np.int64)
    for turn, start, end, n in zip(ok, starts.tolist(), ends.tolist(), n_valid.tolist(), strict=True):
        cached = turn.__dict__  # functools.cached_property's own slots
        cached["length_mismatch"] = None
        cached["valid_mask"] = valid[start:end]
        cached["n_valid"] = n
        cached["disagreement"] = float(diff[start:end][both[start:end]].sum()) if n else 0.0
