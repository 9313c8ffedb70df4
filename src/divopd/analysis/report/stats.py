"""Statistics over seeds: a percentile-bootstrap confidence interval of the mean (:func:`bootstrap_ci`) and the paired
Wilcoxon signed-rank test (:func:`wilcoxon_signed_rank`), exact for small samples; on numpy (SciPy is no dependency)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["EXACT_MAX_N", "bootstrap_ci", "paired_values", "wilcoxon_signed_rank"]

#: Largest number of non-zero pairs for which :func:`wilcoxon_signed_rank` computes the exact distribution.
EXACT_MAX_N = 50


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap confidence interval of the mean of ``values``; ``None`` for fewer than two values."""
    if not 0 < level < 1:
        raise ValueError(f"bootstrap_ci: level must be in (0, 1), got {level}")
    x = np.asarray([float(v) for v in values], dtype=np.float64)
    if len(x) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``a`` (ascending), ties sharing the mean of their ranks."""
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[order] = np.arange(1, len(a) + 1, dtype=np.float64)
    for value in np.unique(a):
        tied = a == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def _exact_two_sided(ranks: np.ndarray, w_plus: float) -> float:
    """Exact two-sided p value of ``W+`` given the ranks: counts of every subset sum of the doubled ranks."""
    doubled = np.rint(ranks * 2).astype(np.int64)
    counts = np.zeros(int(doubled.sum()) + 1, dtype=np.float64)  # counts[s] = sign assignments with 2·W+ = s
    counts[0] = 1.0
    for r in doubled:
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[: len(counts) - r]
        counts = counts + shifted
    total = counts.sum()
    w2 = int(round(w_plus * 2))
    lower = counts[: w2 + 1].sum() / total
    upper = counts[w2:].sum() / total
    return float(min(1.0, 2 * min(lower, upper)))


def _normal_two_sided(ranks: np.ndarray, abs_d: np.ndarray, w_plus: float) -> float:
    n = len(ranks)
    mean = n * (n + 1) / 4
    _, tie_counts = np.unique(abs_d, return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24 - float((tie_counts**3 - tie_counts).sum()) / 48
    if var <= 0:
        return 1.0
    z = (w_plus - mean) / math.sqrt(var)
    return float(min(1.0, math.erfc(abs(z) / math.sqrt(2))))


def wilcoxon_signed_rank(x: Sequence[float], y: Sequence[float]) -> dict[str, float | int | bool | None]:
    """Paired two-sided Wilcoxon signed-rank test of ``x`` against ``y``: zero differences dropped, ties ranked on
    average; the p value exact (every sign assignment of the ranks) up to :data:`EXACT_MAX_N` pairs, else the normal
    approximation with the tie correction.

    Returns ``n`` (pairs with a non-zero difference), ``zeros`` (pairs dropped), ``w_plus`` (rank sum of ``x > y``),
    ``w_minus``, ``p_value`` (``None`` when no pair differs), ``exact`` and ``median_diff`` (median of ``x − y`` over
    all pairs).
    """
    if len(x) != len(y):
        raise ValueError(f"wilcoxon_signed_rank: x and y differ in length ({len(x)} vs {len(y)})")
    d_all = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    if not np.all(np.isfinite(d_all)):
        raise ValueError("wilcoxon_signed_rank: values must be finite")
    d = d_all[d_all != 0]
    out: dict[str, float | int | bool | None] = {
        "n": int(len(d)), "zeros": int(len(d_all) - len(d)), "w_plus": 0.0, "w_minus": 0.0, "p_value": None,
        "exact": len(d) <= EXACT_MAX_N, "median_diff": float(np.median(d_all)) if len(d_all) else None,
    }
    if len(d) == 0:
        return out
    abs_d = np.abs(d)
    ranks = _average_ranks(abs_d)
    w_plus = float(ranks[d > 0].sum())
    out["w_plus"], out["w_minus"] = w_plus, float(ranks[d < 0].sum())
    out["p_value"] = (_exact_two_sided(ranks, w_plus) if len(d) <= EXACT_MAX_N
                      else _normal_two_sided(ranks, abs_d, w_plus))
    return out


def paired_values(a: dict[int, float | None], b: dict[int, float | None]) -> tuple[list[int], list[float], list[float]]:
    """The seeds present with a value in both ``a`` and ``b`` (seed → value), and the two value lists in seed order."""
    seeds = sorted(s for s in a.keys() & b.keys() if a[s] is not None and b[s] is not None)
    return seeds, [float(a[s]) for s in seeds], [float(b[s]) for s in seeds]  # type: ignore[arg-type]
