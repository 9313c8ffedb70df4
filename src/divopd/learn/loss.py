"""The OPD loss of the paper ("Asynchronous multi-turn OPD", loss paragraph) and a non-default top-k estimator.

* stopped advantage   ``A_{t,i} = −β · sg(log π_θold(y_{t,i}) − log π_T(y_{t,i}))``, θ_old: pre-update learner
* per-token objective ``min(r·A, clip(r, 1−ε, 1+ε)·A)`` with ``r = π_θ / π_θold`` (r = 1 with one update per batch)
* effective mask      ``m_{t,i} = action ∧ teacher-valid ∧ finite teacher logprob``
* loss                ``−reduce(objective, m)``, default ``seq-mean-token-mean``: ``Σ_t w_t ℓ_t / N`` over all N rows

Finite for every input. Tensor names carry their axes: ``_NL`` = [rows, positions], ``_NLK`` = [rows, positions, top-k].
"""

from __future__ import annotations

import torch

__all__ = ["REDUCTIONS", "clipped_surrogate", "effective_mask", "opd_loss", "reduce_tokens", "stopped_advantage",
           "topk_reverse_kl", "topk_reverse_kl_loss"]

REDUCTIONS: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum")
LOG_RATIO_CLAMP = 20.0


def effective_mask(mask_NL: torch.Tensor, *values_NL: torch.Tensor) -> torch.Tensor:
    """``m = action ∧ teacher-valid``, also dropping every position where one of ``values_NL`` is not finite."""
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
    """Per-token values over valid positions → a scalar: ``seq-mean-token-mean`` (paper: each row's token mean, then
    the mean over all N rows, dead rows included), ``token-mean`` or ``seq-mean-token-sum``. ``row_weights_N``
    (seq-mean only; ``None`` = unit weights, the paper) gives ``Σ_t w_t ℓ_t / N``. Masked positions never leak NaN/inf
    into the value or its gradient; N = 0 gives 0."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    if row_weights_N is not None:
        if reduction == "token-mean":
            raise ValueError("row weights need a seq-mean reduction (seq-mean-token-mean or seq-mean-token-sum)")
        if row_weights_N.shape != values_NL.shape[:1]:
            raise ValueError(f"row weights have shape {tuple(row_weights_N.shape)}, expected ({values_NL.shape[0]},)")
    masked = torch.where(mask_NL, values_NL, torch.zeros_like(values_NL))
    if reduction == "token-mean":
        n_tok = mask_NL.sum()
        return masked.sum() / torch.clamp(n_tok, min=1).to(masked.dtype)
    row_val = masked.sum(dim=-1)
    if reduction == "seq-mean-token-mean":
        row_val = row_val / torch.clamp(mask_NL.sum(dim=-1), min=1).to(masked.dtype)
    if row_weights_N is not None:
        row_val = row_val * row_weights_N.to(device=row_val.device, dtype=row_val.dtype)
    return row_val.sum() / max(values_NL.shape[0], 1)


def _masked_mean(values_NL: torch.Tensor, mask_NL: torch.Tensor) -> float:
    return float(values_NL.detach()[mask_NL].double().mean()) if bool(mask_NL.any()) else 0.0


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
    """The paper's OPD loss: clipped surrogate of the stopped reverse-KL advantage. All [N, L]: ``logprobs`` log π_θ
    (differentiable); ``old_logprobs`` log π_θold, recomputed on the queued tokens, and ``teacher_logprobs`` (NaN/±inf =
    not scored), both constants; ``mask`` action ∧ teacher-valid. Returns the scalar loss and floats ``loss``,
    ``reverse_kl`` (mean over valid tokens of log π_θold − log π_T), ``valid_tokens``, ``dead_rows``, ``rows``,
    ``clip_frac``, ``ratio_mean``, ``dropped_nonfinite`` (masked-in positions not finite)."""
    if logprobs.dim() != 2:
        raise ValueError(f"opd_loss: logprobs must be [N, L], got shape {tuple(logprobs.shape)}")
    for name, tensor in (("old_logprobs", old_logprobs), ("teacher_logprobs", teacher_logprobs), ("mask", mask)):
        if tensor.shape != logprobs.shape:
            raise ValueError(f"opd_loss: {name} has shape {tuple(tensor.shape)}, expected {tuple(logprobs.shape)} "
                             "like logprobs")
    given = mask.to(torch.bool)
    m = effective_mask(given, teacher_logprobs, old_logprobs, logprobs)
    adv = stopped_advantage(old_logprobs, teacher_logprobs, m, beta)
    m = m & torch.isfinite(adv)  # β·(old − teacher) can overflow for absurd inputs
    adv = torch.where(m, adv, torch.zeros_like(adv))
    # log-ratio clamped (as verl does) so that r cannot overflow to inf and turn 0·inf into NaN
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
    """Per-position ``KL(p_θ ‖ p_T)`` over the teacher's top-k support (entries not finite left out): both
    renormalised on it (``tail=False``), or the (k+1)-way coarsening with the rest as one tail category ``1 − Σ_topk π``
    floored at ``tail_floor`` (``tail=True``: a lower bound of the full KL). [N, L]; NaN where no entry is usable."""
    ok = torch.isfinite(teacher_topk_logprobs_NLK) & torch.isfinite(student_topk_logprobs_NLK.detach())
    neg_inf = torch.full_like(student_topk_logprobs_NLK, float("-inf"))
    s = torch.where(ok, student_topk_logprobs_NLK, neg_inf)
    t = torch.where(ok, teacher_topk_logprobs_NLK.to(s.dtype), neg_inf)
    zeros = torch.zeros_like(s)
    if not tail:
        s, t = torch.log_softmax(s, dim=-1), torch.log_softmax(t, dim=-1)
    # entries outside the support must not produce 0·inf = NaN, in the value or in its gradient
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
    """Non-default estimator (not the paper's): ``β · reduce(KL_topk(p_θ ‖ p_T), mask)``, a denser signal for tiny or
    early students. ``student_topk_logprobs`` [N, L, k]: log π_θ at the teacher's top-k ids (differentiable);
    ``teacher_topk_logprobs`` [N, L, k] (NaN/−inf = missing); the rest as in :func:`opd_loss`. Metrics: ``loss``,
    ``topk_reverse_kl``, ``valid_tokens``, ``dead_rows``, ``rows``, ``dropped_nonfinite``."""
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
