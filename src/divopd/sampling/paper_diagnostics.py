"""The diagnostics of the paper's tables (Appendix: Tables 9, 11, 12, 14, 16 and Figure 6) as pure functions, the one
definition the metrics, the replay and the report use (docs/guides/report.md maps tables to keys), and the run-level
:class:`RunDiagnostics`."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from divopd.experience.turn import Turn
from divopd.sampling.candidate import Candidate

__all__ = ["DEPTH_BUCKETS", "EMA_ALPHA", "OUTCOMES", "RunDiagnostics", "cell_shares", "depth_bucket", "ema_update",
           "gini", "kl_per_token", "kl_tokens", "never_selected_scored_share", "never_selected_share", "outcome",
           "outcome_cells", "rollout_cells", "scored_tokens", "selection_cells", "teacher_tokens_per_trained_token",
           "turns_per_rollout"]

#: Figure 6's smoothing constant.
EMA_ALPHA = 0.12

#: Table 14's turn-depth buckets: (label, lowest turn index, first turn index past the bucket or None).
DEPTH_BUCKETS: tuple[tuple[str, int, int | None], ...] = (("<2", 0, 2), ("[2,4)", 2, 4), ("[4,6)", 4, 6),
                                                           ("[6,10)", 6, 10), ("≥10", 10, None))

#: Table 14's rollout outcomes; ``unknown`` when a turn carries no ``info["success"]`` (e.g. a log without the column).
OUTCOMES: tuple[str, ...] = ("success", "failure", "unknown")


def turns_per_rollout(turns: Sequence[Turn | Candidate]) -> float:
    """Table 9: mean selected turns per distinct rollout of a batch, rows ÷ rollout ids (0 for an empty batch)."""
    rollouts = len({t.rollout_id for t in turns})
    return len(turns) / rollouts if rollouts else 0.0


def kl_tokens(turn: Turn | Candidate) -> int:
    """Tokens :attr:`Turn.disagreement` sums over: valid tokens whose student log probability is finite."""
    return turn.kl_tokens


def kl_per_token(turns: Iterable[Turn | Candidate]) -> float:
    """Table 9: the batch's sampled reverse KL per token, Σ :attr:`Turn.disagreement` ÷ Σ :func:`kl_tokens` (cached
    generating-policy log probabilities; 0.0 without such a token); ``learner/reverse_kl`` is the same mean under the
    learner's log π_θold."""
    total = 0.0
    n = 0
    for t in turns:
        k = kl_tokens(t)
        if k:
            total += t.disagreement
            n += k
    return total / n if n else 0.0


def gini(counts: Iterable[float]) -> float | None:
    """Table 11: Gini coefficient ``Σ_i Σ_j |x_i − x_j| / (2 n² x̄)`` of non-negative counts (``None`` for none; 0.0
    when all are zero), computed in O(n log n) as ``Σ_i (2i − n − 1) x_(i) / (n Σ x)`` over sorted values, i = 1…n."""
    xs = sorted(float(x) for x in counts)
    n = len(xs)
    if n == 0:
        return None
    if any(x < 0 for x in xs):
        raise ValueError("gini: counts must be non-negative")
    total = sum(xs)
    if total == 0:
        return 0.0
    return sum((2 * i - n - 1) * x for i, x in enumerate(xs, 1)) / (n * total)


def never_selected_share(rollouts: Iterable[str], selected: Mapping[str, int] | set[str]) -> float | None:
    """Table 11: share of ``rollouts`` with no selected turn (``None`` when there is no rollout)."""
    rs = set(rollouts)
    if not rs:
        return None
    return sum(1 for r in rs if not (selected.get(r, 0) if isinstance(selected, Mapping) else r in selected)) / len(rs)


def depth_bucket(turn_index: int) -> str:
    """Table 14's bucket label of a turn depth (its ``turn_index``, 0 = the rollout's first turn)."""
    for label, lo, hi in DEPTH_BUCKETS:
        if turn_index >= lo and (hi is None or turn_index < hi):
            return label
    raise ValueError(f"depth_bucket: negative turn index {turn_index}")


def outcome(turn: Turn) -> str:
    """``success``/``failure`` from ``turn.info["success"]`` (the log's ``success`` column), else ``unknown``."""
    value = turn.info.get("success")
    return "unknown" if value is None else "success" if value else "failure"


def selection_cells(turns: Iterable[Turn]) -> Counter[tuple[str, str]]:
    """Turns per (depth bucket, outcome) cell."""
    return Counter((depth_bucket(t.turn_index), outcome(t)) for t in turns)


def rollout_cells(turns: Iterable[Turn]) -> Counter[tuple[str, str]]:
    """Turns per (depth bucket, rollout id): Table 14's cells before the outcomes are known."""
    return Counter((depth_bucket(t.turn_index), t.rollout_id) for t in turns)


def outcome_cells(cells: Mapping[tuple[str, str], int], outcomes: Mapping[str, bool]) -> Counter[tuple[str, str]]:
    """(depth bucket, rollout id) counts as (depth bucket, outcome) counts, by ``outcomes`` (rollout id → success;
    ``unknown`` when absent): under ``explorer.enqueue: turn`` an outcome is known only once its rollout ended."""
    out: Counter[tuple[str, str]] = Counter()
    for (bucket, rid), n in cells.items():
        value = outcomes.get(rid)
        out[(bucket, "unknown" if value is None else "success" if value else "failure")] += n
    return out


def cell_shares(cells: Mapping[tuple[str, str], int]) -> dict[str, dict[str, float | None]]:
    """``{bucket: {outcome: share of the total}}`` of every bucket × outcome (``unknown`` only when some cell has it;
    ``None`` everywhere when the total is 0)."""
    total = sum(cells.values())
    outcomes = [o for o in OUTCOMES if o != "unknown" or any(k[1] == "unknown" and v for k, v in cells.items())]
    return {
        label: {o: (cells.get((label, o), 0) / total if total else None) for o in outcomes}
        for label, _, _ in DEPTH_BUCKETS
    }


def scored_tokens(turn: Turn) -> int:
    """Table 16: response tokens the teacher scored, positions with a finite teacher log prob (0 when not scored)."""
    if turn.teacher_logprobs is None:
        return 0
    return int(np.count_nonzero(np.isfinite(turn.teacher_logprobs)))


def teacher_tokens_per_trained_token(scored: float, trained: float) -> float | None:
    """Teacher tokens scored ÷ response tokens trained (``None`` before any token is trained)."""
    return scored / trained if trained > 0 else None


def never_selected_scored_share(scored: float, scored_selected: float) -> float | None:
    """Share of scored tokens in turns never selected: ``1 − scored_selected ÷ scored`` (``None`` with none scored)."""
    return 1.0 - scored_selected / scored if scored > 0 else None


def ema_update(previous: float | None, value: float, alpha: float = EMA_ALPHA) -> float:
    """Figure 6's EMA step: ``value`` at the first update, then ``α·value + (1 − α)·previous``."""
    if previous is None or (isinstance(previous, float) and math.isnan(previous)):
        return float(value)
    return alpha * float(value) + (1.0 - alpha) * float(previous)


class RunDiagnostics:
    """The cumulative diagnostics of a training run (Table 16's token counts, Figure 6's EMA) in a plain dict
    (``state``) that checkpoints carry; :meth:`observe_batch` returns the update's ``sampler/`` metrics."""

    def __init__(self, state: MutableMapping[str, Any] | None = None, alpha: float = EMA_ALPHA) -> None:
        self.state: MutableMapping[str, Any] = state if state is not None else {}
        self.state.setdefault("scored_tokens_received", 0)
        self.state.setdefault("response_tokens_trained", 0)
        self.state.setdefault("disagreement_std_ema", None)
        self.alpha = alpha

    def observe_received(self, turns: Iterable[Turn]) -> None:
        self.state["scored_tokens_received"] += sum(scored_tokens(t) for t in turns)

    def observe_batch(self, stats: Mapping[str, float]) -> dict[str, float]:
        s = self.state
        s["response_tokens_trained"] += int(stats.get("response_tokens", 0))
        if "disagreement_std_across_rollouts" in stats:
            s["disagreement_std_ema"] = ema_update(s["disagreement_std_ema"],
                                                   float(stats["disagreement_std_across_rollouts"]), self.alpha)
        ratio = teacher_tokens_per_trained_token(s["scored_tokens_received"], s["response_tokens_trained"])
        out = {"sampler/scored_tokens_received": float(s["scored_tokens_received"]),
               "sampler/response_tokens_trained": float(s["response_tokens_trained"])}
        if ratio is not None:
            out["sampler/teacher_tokens_per_trained_token"] = ratio
        if s["disagreement_std_ema"] is not None:
            out["sampler/disagreement_std_ema"] = float(s["disagreement_std_ema"])
        return out
