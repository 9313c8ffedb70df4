"""Trinity-RFT ``Experience`` records as divopd's sampler reads them (one student turn each), and as Trinity's trainer
may receive them: finite for its stock ``on_policy_distill`` advantage (:func:`mask_unscored`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from trinity.common.experience import Experience

from divopd.errors import UsageError
from divopd.experience import Turn
from divopd.integrations.trinity_queue import Arrays, LightHeader, light_function
from divopd.sampling import Candidate
from divopd.sampling.candidate import task_key
from divopd.sampling.gate import verdict

__all__ = ["TURN_VERSION_KEY", "UNSCORED_KEY", "experience_to_turn", "mask_unscored", "policy_version",
           "light_candidates", "read_candidates", "restore_model_version", "stale_candidate"]

#: ``info`` key of the policy version that generated the turn (divopd's workflows set it; it beats model_version,
#: which Trinity's ``WorkflowRunner.run_task`` overwrites with the version at the task's start).
TURN_VERSION_KEY = "divopd_policy_version"
#: ``info`` key set True by divopd's workflows when the teacher could not score the turn at all (its teacher log
#: probs are then a finite placeholder under an all-False action mask; the gate counts it ``missing_teacher``).
UNSCORED_KEY = "divopd_unscored"
_WHO = "sample_strategy divopd"
_NATIVE = {np.int64: torch.int64, np.float32: torch.float32, bool: torch.bool}
_LIGHT = light_function(TURN_VERSION_KEY, UNSCORED_KEY)


def _numpy(tensor: Any, dtype: Any) -> np.ndarray | None:
    if tensor is None:
        return None
    if isinstance(tensor, torch.Tensor):
        if tensor.dtype == _NATIVE.get(dtype) and tensor.dim() == 1 and tensor.device.type == "cpu" \
                and not tensor.requires_grad:
            return tensor.numpy()  # a view: Turn copies nothing it does not convert
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
    Raises :class:`UsageError` (one line naming the field) when the record has no rollout id or no model version."""
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
    """Make ``exp`` finite for Trinity's stock OPD advantage (``kl_coef * (teacher - old) * response_mask``: NaN * 0
    is NaN): a position with a teacher log prob not finite leaves ``action_mask`` and gets the student's log prob (0
    where that is not finite either). Returns how many *action* positions left the mask."""
    if exp.teacher_logprobs is None:
        return 0
    teacher = torch.as_tensor(exp.teacher_logprobs)
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
    exp.teacher_logprobs = torch.where(unscored, fill, teacher)
    exp.action_mask = mask & ~unscored
    return int((unscored & mask).sum())


def read_candidates(experiences: list[Experience]) -> tuple[list[Candidate | UsageError], list[bool]]:
    """The :class:`Candidate` of each record, in order (a record that stops the run gives its :class:`UsageError` in
    its place), and per record whether it has a teacher position that is not finite (:func:`mask_unscored`).

    The common record (:func:`~divopd.integrations.trinity_queue.light_function`) builds no :class:`Turn`: the values
    the gate and the rules read are computed for the whole read at once (:func:`light_candidates`)."""
    out: list[Candidate | UsageError | None] = [None] * len(experiences)
    unscored = [False] * len(experiences)
    at, heads, arrays = _LIGHT(experiences)
    if arrays is not None:
        for i, (candidate, flag) in zip(at, light_candidates(heads, arrays), strict=True):
            out[i], unscored[i] = candidate, flag
    for i, exp in enumerate(experiences):
        if out[i] is None:
            try:
                out[i], unscored[i] = _slow(exp)
            except UsageError as exc:
                out[i] = exc
    return out, unscored  # type: ignore[return-value]  (every slot is filled)


def light_candidates(heads: list[LightHeader], arrays: Arrays) -> list[tuple[Candidate, bool]]:
    """The candidates of records read from their headers and concatenated response arrays
    (:func:`~divopd.integrations.trinity_queue.light_function`), equal to those of :func:`experience_to_turn`, and
    whether each has a teacher position that is not finite."""
    lengths, student, teacher, action = arrays
    starts, n_valid, kl, disagreement = _cached_values(student, teacher, action, lengths)
    masked = (np.add.reduceat(~np.isfinite(teacher), starts, dtype=np.int64) > 0).tolist()
    return [(Candidate(rid, step, version, n, nv, k, d, verdict(cut, n, True, True, None, nv),
                       task_key(task, rid)), flag)
            for (rid, step, version, cut, task), n, nv, k, d, flag
            in zip(heads, lengths.tolist(), n_valid, kl, disagreement, masked, strict=True)]


def stale_candidate(rollout_id: str, turn_index: int, policy_version: int, task: Any) -> Candidate:
    """The candidate of a record left unserialized in the queue actor because it arrived stale: the sampler expires it
    (``ledger/expired/stale``) before the gate or a rule reads more than its version, so its token counts are 0."""
    return Candidate(rollout_id, turn_index, policy_version, 0, 0, 0, 0.0, None, task_key(task, rollout_id))


def _slow(exp: Experience) -> tuple[Candidate, bool]:
    turn = experience_to_turn(exp)
    return Candidate.of(turn), turn.teacher_logprobs is not None and not bool(np.isfinite(turn.teacher_logprobs).all())


def _segment_sums(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per segment (consecutive runs of ``counts`` values), ``values[segment].sum()`` bit for bit as numpy sums a 1-d
    array: the segments of one length are summed as the rows of one C-contiguous 2-d array."""
    out = np.zeros(counts.shape[0], dtype=np.float64)
    starts = np.cumsum(counts) - counts
    for k in np.unique(counts).tolist():
        if k == 0:
            continue
        rows = np.flatnonzero(counts == k)
        out[rows] = values[starts[rows][:, None] + np.arange(k)].sum(axis=1)
    return out


def _cached_values(student: np.ndarray, teacher: np.ndarray, action: np.ndarray,
                   lengths: np.ndarray) -> tuple[np.ndarray, list[int], list[int], list[float]]:
    """For turns whose response arrays are concatenated (``lengths`` each): their starts, and per turn ``n_valid``,
    ``kl_tokens`` and ``disagreement`` (0 / 0.0 without a valid token), equal to what :class:`Turn` computes."""
    starts = np.cumsum(lengths) - lengths
    valid = np.isfinite(teacher) & action  # Turn.valid_mask
    both = valid & np.isfinite(student)  # the positions Turn.disagreement sums over
    n_valid = np.add.reduceat(valid, starts, dtype=np.int64)
    kl = np.add.reduceat(both, starts, dtype=np.int64)  # 0 where n_valid is 0 (no valid position, none of both)
    disagreement = _segment_sums(np.subtract(student, teacher, dtype=np.float64)[both], kl)
    return starts, n_valid.tolist(), kl.tolist(), disagreement.tolist()
