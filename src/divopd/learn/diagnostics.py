"""Diagnostics of the paper's Appendix E on a composed batch (``batch.candidates`` = the pool), and the exact
full-vocabulary reverse KL of tiny models; none changes the model or leaves gradients on it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from divopd.experience.turn import Turn
from divopd.learn.inputs import update_inputs
from divopd.learn.loss import opd_loss
from divopd.learn.update import forward_pass
from divopd.models.packing import pack_sequences, selected_logits
from divopd.models.scoring import response_logprobs

__all__ = ["full_reverse_kl", "gradient_diagnostics", "opd_gradient", "ranking_stability", "spearman"]


def _turns_of(batch: Any) -> list[Turn]:
    return list(getattr(batch, "payloads", batch))


def opd_gradient(model: torch.nn.Module, turns: Sequence[Turn], *, beta: float = 1.0,
                 reduction: str = "seq-mean-token-mean", layout: str = "packed", pad_id: int = 0) -> torch.Tensor:
    """Flat float32 gradient of :func:`~divopd.learn.loss.opd_loss` over ``turns`` at θ = θ_old (no ``.grad``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    inputs = update_inputs(turns)
    lp, _, scored, _, _ = forward_pass(model, inputs, np.arange(len(inputs)), layout=layout, pad_id=pad_id,
                                       device=device)
    m = torch.from_numpy(inputs.mask).to(device) & scored
    loss, _ = opd_loss(lp, lp.detach(), torch.from_numpy(inputs.teacher).to(device), m, beta=beta, reduction=reduction)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(grads, params,
                                                                                                     strict=True)])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(torch.dot(a, b)) / (na * nb)


def gradient_diagnostics(model: torch.nn.Module, batch: Any, *, beta: float = 1.0,
                         reduction: str = "seq-mean-token-mean", max_rows: int | None = 64, layout: str = "packed",
                         pad_id: int = 0, seed: int = 0) -> dict[str, float]:
    """Appendix E.3 on one composed batch (before its update): ``diag/grad_cos_pool`` = cos(g_batch, g_pool) (g_pool:
    the OPD gradient of the valid ``batch.candidates``), ``diag/grad_proj_pool`` = ⟨g_batch, g_pool⟩ / ‖g_pool‖,
    ``diag/grad_pairwise_cos`` = the mean cos(g_i, g_j) over pairs of rows (at most ``max_rows``, seeded), as
    (‖Σ u_i‖² − n) / (n(n−1)) with u_i = g_i/‖g_i‖; and ``diag/grad_norm_batch``, ``_norm_pool``, ``_pool_turns``,
    ``_rows``."""
    turns = _turns_of(batch)
    pool = [t for t in getattr(batch, "candidates", []) if t.n_valid > 0]
    kw = dict(beta=beta, reduction=reduction, layout=layout, pad_id=pad_id)
    g_batch = opd_gradient(model, turns, **kw).double()  # float64 norms and dots over ~10⁶ entries
    out = {"diag/grad_norm_batch": float(g_batch.norm()), "diag/grad_pool_turns": float(len(pool))}
    if pool:
        g_pool = opd_gradient(model, pool, **kw).double()
        n_pool = float(g_pool.norm())
        out["diag/grad_norm_pool"] = n_pool
        out["diag/grad_cos_pool"] = _cos(g_batch, g_pool)
        out["diag/grad_proj_pool"] = float(torch.dot(g_batch, g_pool)) / n_pool if n_pool > 0 else 0.0
    else:
        out.update({"diag/grad_norm_pool": float("nan"), "diag/grad_cos_pool": float("nan"),
                    "diag/grad_proj_pool": float("nan")})
    live = [t for t in turns if t.n_valid > 0]
    if max_rows is not None and len(live) > max_rows:
        pick = np.random.default_rng(seed).choice(len(live), size=max_rows, replace=False)
        live = [live[i] for i in sorted(pick)]
    total = None
    n = 0
    for t in live:
        g = opd_gradient(model, [t], **kw).double()  # float64: (‖Σu‖² − n) cancels heavily when rows are alike
        norm = g.norm()
        if float(norm) == 0.0:
            continue
        u = g / norm
        total = u if total is None else total + u
        n += 1
    out["diag/grad_rows"] = float(n)
    out["diag/grad_pairwise_cos"] = (float(total.dot(total)) - n) / (n * (n - 1)) if n >= 2 else float("nan")
    return out


def _rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the rank of each distinct value's last copy
    return (last - (counts - 1) / 2.0)[inverse]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when fewer than 2 items or a constant input."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) != len(b):
        raise ValueError(f"spearman: lengths differ ({len(a)} vs {len(b)})")
    if len(a) < 2:
        return float("nan")
    ra, rb = _rankdata(a), _rankdata(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def current_disagreement(model: torch.nn.Module, turns: Sequence[Turn], *, pad_id: int = 0,
                         max_tokens_per_batch: int = 8192) -> np.ndarray:
    """The focus score recomputed with ``model``: Σ over valid tokens of (log π_model(y) − log π_T(y)), per turn."""
    lps = response_logprobs(model, [t.prompt_ids for t in turns], [t.response_ids for t in turns],
                            max_tokens_per_batch=max_tokens_per_batch, pad_id=pad_id)
    out = np.zeros(len(turns))
    for i, (t, lp) in enumerate(zip(turns, lps, strict=True)):
        m = t.valid_mask & np.isfinite(lp)
        out[i] = float((lp[m].astype(np.float64) - t.teacher_logprobs[m].astype(np.float64)).sum()) if m.any() else 0.0
    return out


def ranking_stability(model: torch.nn.Module, batch: Any, *, pad_id: int = 0, min_rollout_turns: int = 3,
                      max_tokens_per_batch: int = 8192) -> dict[str, float]:
    """Appendix E.2: do focus rankings made with the generating policy survive the learner's lag? Over the valid
    candidate turns with generating log probabilities: ``diag/focus_spearman``, ``diag/focus_spearman_within_rollout``
    (mean over rollouts with at least ``min_rollout_turns`` turns), ``diag/focus_turns``, ``diag/focus_rollouts`` and
    ``diag/focus_mean_abs_change`` (mean |current − generating| score)."""
    pool = list(getattr(batch, "candidates", []) or _turns_of(batch))
    turns = [t for t in pool if t.n_valid > 0 and t.student_logprobs is not None]
    if not turns:
        return {"diag/focus_spearman": float("nan"), "diag/focus_spearman_within_rollout": float("nan"),
                "diag/focus_turns": 0.0, "diag/focus_rollouts": 0.0, "diag/focus_mean_abs_change": float("nan")}
    gen = np.array([t.disagreement for t in turns])
    cur = current_disagreement(model, turns, pad_id=pad_id, max_tokens_per_batch=max_tokens_per_batch)
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(turns):
        groups.setdefault(t.rollout_id, []).append(i)
    within = [spearman(gen[idx], cur[idx]) for idx in groups.values() if len(idx) >= min_rollout_turns]
    within = [w for w in within if np.isfinite(w)]
    return {
        "diag/focus_spearman": spearman(gen, cur),
        "diag/focus_spearman_within_rollout": float(np.mean(within)) if within else float("nan"),
        "diag/focus_turns": float(len(turns)),
        "diag/focus_rollouts": float(len(within)),
        "diag/focus_mean_abs_change": float(np.mean(np.abs(cur - gen))),
    }


@torch.no_grad()
def full_reverse_kl(student: torch.nn.Module, teacher: torch.nn.Module, turns: Sequence[Turn], *,
                    pad_id: int = 0) -> float:
    """Mean over the turns' valid positions of the exact KL(π_student(·|h) ‖ π_teacher(·|h)) (shared vocabulary)."""
    inputs = update_inputs(turns)
    mask = torch.from_numpy(inputs.mask)
    packed = pack_sequences(inputs.prompts, inputs.responses, layout="packed", pad_id=pad_id)
    keep_valid = mask[packed.seq_index, packed.token_index]
    if not bool(keep_valid.any()):
        return float("nan")
    ls = torch.log_softmax(selected_logits(student, packed.to(next(student.parameters()).device)).float().cpu(), -1)
    lt = torch.log_softmax(selected_logits(teacher, packed.to(next(teacher.parameters()).device)).float().cpu(), -1)
    kl = (ls.exp() * (ls - lt)).sum(-1)
    return float(kl[keep_valid].mean())
