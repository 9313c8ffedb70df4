"""The OPD loss of the paper ("Asynchronous multi-turn OPD", loss paragraph), and a non-default top-k estimator.

For row ``t`` (one student response turn) and response position ``i``, with ``θ_old`` the learner snapshot immediately
before the update (its log probabilities recomputed on the queued tokens) and ``π_T`` the frozen teacher:

* stopped advantage   ``A_{t,i} = −β · sg(log π_θold(y_{t,i}) − log π_T(y_{t,i}))``
* per-token objective ``min(r·A, clip(r, 1−ε, 1+ε)·A)`` with ``r = π_θ / π_θold``
* effective mask      ``m_{t,i} = action ∧ teacher-valid ∧ finite teacher logprob``
* loss                ``−reduce(objective, m)``; the default reduction ``seq-mean-token-mean`` averages the valid
  tokens of each row, then averages over **all N rows**: a dead row (no valid token) contributes 0 and stays in the
  denominator. Optional per-row weights (``row_weights``: ``divopd-focus``'s task balance, TurnOPD's schedule) multiply
  each row's term, ``Σ_t w_t ℓ_t / N``; without them (the paper: unit weights) nothing changes.

With one optimizer update per batch ``r == 1`` at gradient evaluation and clipping is inactive (kept for generality).
No entropy term, KL penalty, critic or reference model. Minimising the loss lowers the reverse KL to the teacher: the
gradient is ``β · E_valid[(log π_θ(y) − log π_T(y)) ∇ log π_θ(y)]``, the sampled-token reverse-KL policy gradient.

The loss is finite for every input: positions whose teacher, student or θ_old log probability is not finite are
dropped from the mask (and counted), the log ratio is clamped to ±20 before ``exp`` (as verl does), and a batch of only
dead rows gives loss 0 with zero gradients.

Tensor names carry their axes: ``_NL`` = [rows, response positions], ``_NLK`` = [rows, positions, top-k entries].
"""

from __future__ import annotations

import torch

__all__ = [
    "REDUCTIONS",
    "clipped_surrogate",
    "effective_mask",
    "opd_loss",
    "reduce_tokens",
    "stopped_advantage",
    "topk_reverse_kl",
    "topk_reverse_kl_loss",
]

REDUCTIONS: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum")
LOG_RATIO_CLAMP = 20.0


def _check_shapes(name_to_tensor: dict[str, torch.Tensor], shape: torch.Size) -> None:
    for name, tensor in name_to_tensor.items():
        if tensor.shape != shape:
            raise ValueError(f"opd_loss: {name} has shape {tuple(tensor.shape)}, expected {tuple(shape)} like logprobs")


def effective_mask(mask_NL: torch.Tensor, *values_NL: torch.Tensor) -> torch.Tensor:
    """The paper's effective mask ``m = action ∧ teacher-valid``, additionally dropping every position where one of
    ``values_NL`` (teacher, θ_old or student log probabilities) is not finite, so the loss stays finite."""
    m = mask_NL.to(torch.bool)
    for v in values_NL:
        m = m & torch.isfinite(v.detach())
    return m


def stopped_advantage(old_logprobs_NL: torch.Tensor, teacher_logprobs_NL: torch.Tensor, mask_NL: torch.Tensor,
                      beta: float) -> torch.Tensor:
    """``A = −β · sg(log π_θold(y) − log π_T(y))`` on valid positions, 0 elsewhere (never NaN, never differentiable)."""
    diff = old_logprobs_NL.detach() - teacher_logprobs_NL.detach()
    return torch.where(mask_NL, -beta * diff, torch.zeros_like(diff))


def clipped_surrogate(ratio_NL: torch.Tensor, advantage_NL: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """PPO's per-token objective ``min(r·A, clip(r, 1−ε, 1+ε)·A)`` (to be maximised)."""
    return torch.minimum(ratio_NL * advantage_NL, torch.clamp(ratio_NL, 1.0 - clip_eps, 1.0 + clip_eps) * advantage_NL)


def reduce_tokens(values_NL: torch.Tensor, mask_NL: torch.Tensor,
                  reduction: str = "seq-mean-token-mean", row_weights_N: torch.Tensor | None = None) -> torch.Tensor:
    """Aggregate per-token values over valid positions into a scalar.

    * ``seq-mean-token-mean`` (paper): mean over the valid tokens of each row, then mean over all N rows; a dead row
      contributes 0 and stays in the denominator.
    * ``token-mean``: sum over all valid tokens ÷ number of valid tokens (0 when there is none).
    * ``seq-mean-token-sum``: sum over the valid tokens of each row, then mean over all N rows.

    ``row_weights_N`` (seq-mean reductions only; ``None`` = unit weights, the paper's loss, computed exactly as without
    the argument): each row's value is multiplied by its weight before the mean over all N rows, i.e.
    ``Σ_t w_t ℓ_t / N`` (``divopd-focus``'s task balance, TurnOPD's schedule; such weights average 1).

    Masked positions are replaced by 0 with ``torch.where`` (not multiplied), so NaN/inf there never leak into the value
    or its gradient. With N = 0 rows the result is 0.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    if row_weights_N is not None:
        if reduction == "token-mean":
            raise ValueError("row weights need a seq-mean reduction (seq-mean-token-mean or seq-mean-token-sum)")
        if row_weights_N.shape != values_NL.shape[:1]:
            raise ValueError(f"row weights have shape {tuple(row_weights_N.shape)}, expected ({values_NL.shape[0]},)")
    masked = torch.where(mask_NL, values_NL, torch.zeros_like(values_NL))
    n_rows = values_NL.shape[0]
    if reduction == "token-mean":
        n_tok = mask_NL.sum()
        return masked.sum() / torch.clamp(n_tok, min=1).to(masked.dtype)
    row_sum = masked.sum(dim=-1)
    if reduction == "seq-mean-token-mean":
        row_val = row_sum / torch.clamp(mask_NL.sum(dim=-1), min=1).to(masked.dtype)
    else:
        row_val = row_sum
    if row_weights_N is not None:
        row_val = row_val * row_weights_N.to(device=row_val.device, dtype=row_val.dtype)
    return row_val.sum() / max(n_rows, 1)


def _masked_mean(values_NL: torch.Tensor, mask_NL: torch.Tensor) -> float:
    n = int(mask_NL.sum())
    if n == 0:
        return 0.0
    return float(values_NL.detach()[mask_NL].double().mean())


def opd_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 1.0,
    clip_eps: float = 0.2,
    reduction: str = "seq-mean-token-mean",
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The paper's OPD loss: clipped surrogate of the stopped reverse-KL advantage, reduced ``seq-mean-token-mean``.

    Args:
        logprobs: [N, L] log π_θ of the response tokens (differentiable).
        old_logprobs: [N, L] log π_θold of the same tokens, θ_old = the learner snapshot immediately before the update
            (recomputed on the queued tokens, not the generating policy's). Treated as a constant.
        teacher_logprobs: [N, L] frozen-teacher log probabilities; NaN/±inf = not scored. Treated as a constant.
        mask: [N, L] bool, action ∧ teacher-valid (positions past a row's length are False).
        beta: distillation coefficient β.
        clip_eps: PPO clip ε (inactive at r = 1).
        reduction: ``seq-mean-token-mean`` (paper), ``token-mean`` or ``seq-mean-token-sum``.
        row_weights: [N] per-row loss weights (see :func:`reduce_tokens`); ``None`` = unit weights (the paper).

    Returns:
        ``(loss, metrics)``: scalar loss (finite for every input) and floats ``loss``, ``reverse_kl`` (mean over valid
        tokens of log π_θold − log π_T, the sampled reverse-KL estimate), ``valid_tokens``, ``dead_rows``, ``rows``,
        ``clip_frac``, ``ratio_mean``, ``dropped_nonfinite`` (masked-in positions dropped for a non-finite value).
    """
    if logprobs.dim() != 2:
        raise ValueError(f"opd_loss: logprobs must be [N, L], got shape {tuple(logprobs.shape)}")
    _check_shapes({"old_logprobs": old_logprobs, "teacher_logprobs": teacher_logprobs, "mask": mask}, logprobs.shape)
    given = mask.to(torch.bool)
    m = effective_mask(given, teacher_logprobs, old_logprobs, logprobs)
    adv = stopped_advantage(old_logprobs, teacher_logprobs, m, beta)
    m = m & torch.isfinite(adv)  # β·(old − teacher) can overflow for absurd inputs
    adv = torch.where(m, adv, torch.zeros_like(adv))
    # r = exp(logπ_θ − logπ_θold), only where valid, log-ratio clamped to ±LOG_RATIO_CLAMP (inactive in practice:
    # r = 1 with one update per batch) so that the ratio cannot overflow to inf and turn 0·inf into NaN.
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    ratio = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    objective = clipped_surrogate(ratio, adv, clip_eps)
    loss = -reduce_tokens(objective, m, reduction, row_weights)

    with torch.no_grad():
        n_valid = int(m.sum())
        clipped = (torch.abs(ratio - 1.0) > clip_eps) & m
        metrics = {
            "loss": float(loss.detach()),
            "reverse_kl": _masked_mean(old_logprobs - teacher_logprobs, m),
            "valid_tokens": float(n_valid),
            "dead_rows": float((m.sum(dim=-1) == 0).sum()),
            "rows": float(logprobs.shape[0]),
            "clip_frac": float(clipped.sum()) / max(n_valid, 1),
            "ratio_mean": _masked_mean(ratio, m) if n_valid else 1.0,
            "dropped_nonfinite": float((given & ~m).sum()),
        }
    return loss, metrics


def topk_reverse_kl(student_topk_logprobs_NLK: torch.Tensor, teacher_topk_logprobs_NLK: torch.Tensor, *,
                    tail: bool = False, tail_floor: float = 1e-6) -> torch.Tensor:
    """Per-position reverse KL ``KL(p_θ ‖ p_T)`` over the teacher's top-k support.

    ``tail=False``: both distributions renormalised on the support, ``p_θ = softmax(log π_θ[topk])`` and
    ``p_T = softmax(log π_T[topk])``; the student's mass outside the teacher's top-k is not seen. ``tail=True``: the
    support keeps its full-vocabulary probabilities and everything else is one more category, the tail
    ``1 − Σ_topk π`` (floored at ``tail_floor``), so the KL is that of the two (k+1)-way coarsenings: a lower bound of
    the full-vocabulary KL that also pulls the student's mass off tokens the teacher does not rank. Entries whose
    teacher or student value is not finite are left out of the support. Returns [N, L]; NaN where a position has no
    usable entry (mask it out).
    """
    ok = torch.isfinite(teacher_topk_logprobs_NLK) & torch.isfinite(student_topk_logprobs_NLK.detach())
    neg_inf = torch.full_like(student_topk_logprobs_NLK, float("-inf"))
    s = torch.where(ok, student_topk_logprobs_NLK, neg_inf)
    t = torch.where(ok, teacher_topk_logprobs_NLK.to(s.dtype), neg_inf)
    zeros = torch.zeros_like(s)
    if not tail:
        s, t = torch.log_softmax(s, dim=-1), torch.log_softmax(t, dim=-1)
    # Sanitise: entries outside the support (and rows with no support) must not produce 0·inf = NaN, in the value
    # or in its gradient.
    log_ps = torch.where(ok, s, zeros)
    log_pt = torch.where(ok, t, zeros)
    kl = torch.where(ok, log_ps.exp() * (log_ps - log_pt), zeros).sum(dim=-1)
    if tail:
        ps_tail = (1.0 - torch.where(ok, log_ps.exp(), zeros).sum(dim=-1)).clamp(min=tail_floor)
        pt_tail = (1.0 - torch.where(ok, log_pt.exp(), zeros).sum(dim=-1)).clamp(min=tail_floor)
        kl = kl + ps_tail * (ps_tail.log() - pt_tail.log())
    return torch.where(ok.any(dim=-1), kl, torch.full_like(kl, float("nan")))


def topk_reverse_kl_loss(
    student_topk_logprobs: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 1.0,
    reduction: str = "seq-mean-token-mean",
    row_weights: torch.Tensor | None = None,
    tail: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Non-default estimator: ``β · reduce(KL_topk(p_θ ‖ p_T))`` over valid positions (see :func:`topk_reverse_kl`).

    Some OPD trainers distil the teacher's top-k distribution instead of the sampled token's advantage; it gives a
    denser signal to tiny or early students that learn too slowly from the sampled token alone. It is not the paper's
    estimator (that is :func:`opd_loss`). Gradients flow through ``student_topk_logprobs`` (the student's
    full-vocabulary log probabilities gathered at the teacher's top-k ids); the teacher values are constants.

    Args:
        student_topk_logprobs: [N, L, k] log π_θ at the teacher's top-k ids of each position.
        teacher_topk_logprobs: [N, L, k] the teacher's top-k log probabilities (NaN/−inf = entry missing).
        mask: [N, L] bool, action ∧ teacher-valid.
        beta, reduction, row_weights: as in :func:`opd_loss` (dead rows stay in the denominator).
        tail: keep the student's mass outside the top-k as one more category (see :func:`topk_reverse_kl`).

    Returns:
        ``(loss, metrics)`` with ``loss``, ``topk_reverse_kl`` (mean over valid positions), ``valid_tokens``,
        ``dead_rows``, ``rows``, ``dropped_nonfinite``.
    """
    if student_topk_logprobs.dim() != 3 or student_topk_logprobs.shape != teacher_topk_logprobs.shape:
        raise ValueError(
            "topk_reverse_kl_loss: student and teacher top-k log probabilities must both be [N, L, k], got "
            f"{tuple(student_topk_logprobs.shape)} and {tuple(teacher_topk_logprobs.shape)}"
        )
    if mask.shape != student_topk_logprobs.shape[:2]:
        raise ValueError(f"topk_reverse_kl_loss: mask has shape {tuple(mask.shape)}, expected "
                         f"{tuple(student_topk_logprobs.shape[:2])}")
    given = mask.to(torch.bool)
    kl = topk_reverse_kl(student_topk_logprobs, teacher_topk_logprobs.detach(), tail=tail)
    m = effective_mask(given, kl)
    loss = beta * reduce_tokens(kl, m, reduction, row_weights)
    with torch.no_grad():
        metrics = {
            "loss": float(loss.detach()),
            "topk_reverse_kl": _masked_mean(kl, m),
            "valid_tokens": float(m.sum()),
            "dead_rows": float((m.sum(dim=-1) == 0).sum()),
            "rows": float(mask.shape[0]),
            "dropped_nonfinite": float((given & ~m).sum()),
        }
    return loss, metrics
