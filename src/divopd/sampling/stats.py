"""Batch statistics (paper, "Concentration within an update" and Figure 6)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TypedDict

from divopd.sampling.candidate import Candidate
from divopd.sampling.paper_diagnostics import kl_per_token, turns_per_rollout

__all__ = ["BatchStats", "batch_stats", "effective_rollouts"]


class BatchStats(TypedDict, total=False):
    """``Batch.stats``, a plain ``dict`` logged as ``sampler/<key>``: the batch's composition (:func:`batch_stats`; an
    empty batch has only the first five keys) and what :meth:`~divopd.sampling.Sampler.next_batch` did to the queue."""

    rows: int
    distinct_rollouts: int
    effective_rollouts: float  # (Σ_r p_r²)^-1 over rollout token shares p_r
    max_rollout_share: float
    dead_rows: int  # rows with no valid token
    response_tokens: int
    valid_tokens: int
    mean_staleness: float  # mean of learner − generating version (Table 12)
    max_staleness: int
    version_min: int
    version_max: int
    version_mean: float
    disagreement_mean: float
    disagreement_std_across_rollouts: float  # Figure 6
    turns_per_rollout: float  # Table 9
    kl_per_token: float  # Table 9
    # set by Sampler.next_batch
    expired: int  # turns expired during this call
    invalid: int  # turns the gate rejected during this call
    pending: int  # turns in the pending pool after it
    queued: int  # turns in the queue after it
    candidates: int  # valid candidate turns inspected
    candidate_rollouts: int  # distinct rollouts among them


def effective_rollouts(shares: Sequence[float]) -> float:
    """Effective rollout count ``(Σ_r p_r²)^-1`` of per-rollout shares ``p_r`` (0 for an empty batch)."""
    total = sum(p * p for p in shares)
    return 1.0 / total if total > 0 else 0.0


def batch_stats(turns: Sequence[Candidate], learner_version: int) -> BatchStats:
    """The keys of :class:`BatchStats` up to ``kl_per_token`` for a batch's rows: token shares of its response tokens
    (row shares without any); the population std across rollouts of each one's summed disagreement (Figure 6)."""
    rows = len(turns)
    if rows == 0:
        return {"rows": 0, "distinct_rollouts": 0, "effective_rollouts": 0.0, "max_rollout_share": 0.0, "dead_rows": 0}
    tokens: dict[str, int] = {}
    disagreement: dict[str, float] = {}
    versions = [t.policy_version for t in turns]
    n_valid = [t.n_valid for t in turns]
    for t in turns:
        tokens[t.rollout_id] = tokens.get(t.rollout_id, 0) + t.response_len
        disagreement[t.rollout_id] = disagreement.get(t.rollout_id, 0.0) + t.disagreement
    total_tokens = sum(tokens.values())
    weights = tokens if total_tokens > 0 else Counter(t.rollout_id for t in turns)
    denom = total_tokens if total_tokens > 0 else rows
    shares = [w / denom for w in weights.values()]
    per_rollout = list(disagreement.values())
    mean_d = sum(per_rollout) / len(per_rollout)
    std_d = math.sqrt(sum((d - mean_d) ** 2 for d in per_rollout) / len(per_rollout))
    return {
        "rows": rows,
        "distinct_rollouts": len(tokens),
        "effective_rollouts": effective_rollouts(shares),
        "max_rollout_share": max(shares),
        "dead_rows": n_valid.count(0),
        "response_tokens": total_tokens,
        "valid_tokens": sum(n_valid),
        "mean_staleness": (rows * learner_version - sum(versions)) / rows,  # mean of learner − generating version
        "max_staleness": learner_version - min(versions),
        "version_min": min(versions),
        "version_max": max(versions),
        "version_mean": sum(versions) / rows,
        "disagreement_mean": sum(per_rollout) / rows,
        "disagreement_std_across_rollouts": std_d,
        "turns_per_rollout": turns_per_rollout(turns),
        "kl_per_token": kl_per_token(turns),
    }
