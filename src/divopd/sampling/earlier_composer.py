"""DivOPD-focus, the paper's *earlier* composer (Appendix A.1), as we read it: no gate, task groups in seeded random
order, a first pass of at most 3 turns and a 25% token share per task group, then a pass without the turn cap and a
fill without either cap; task-balance row weights. The reading, step by step: docs/concepts/sampler.md."""

from __future__ import annotations

from collections import Counter

import numpy as np

from divopd.sampling.candidate import Columns
from divopd.sampling.registry import RuleSettings
from divopd.sampling.rules import focus_order

__all__ = ["FOCUS_TURN_CAP", "FOCUS_TOKEN_SHARE", "compose_divopd_focus", "task_balance_weights"]

#: First-pass turn cap of a task group (the paper: "caps a group at three turns").
FOCUS_TURN_CAP = 3
#: First-pass (and relaxing-pass) token share of a task group (the paper: "a task's token share at 25%").
FOCUS_TOKEN_SHARE = 0.25


def compose_divopd_focus(pool: Columns, batch_size: int, settings: RuleSettings | None,
                         rng: np.random.Generator) -> np.ndarray:
    """``divopd-focus``'s rule: positions by (pass, task group visiting order, focus rank); the group names are sorted,
    then permuted once per composition with ``rng``; the token share is of ``B ×`` the pool's mean response length."""
    if batch_size <= 0 or len(pool) == 0:
        return np.zeros(0, dtype=np.intp)
    names, inverse = np.unique(pool.task, return_inverse=True)
    ordinal = np.empty(len(names), dtype=np.intp)
    ordinal[rng.permutation(len(names))] = np.arange(len(names))
    group = ordinal[inverse.reshape(-1)]
    order = focus_order(pool.disagreement, pool.rollout_id, pool.turn_index, group)
    group = group[order]
    lengths = pool.response_len[order]
    share = FOCUS_TOKEN_SHARE * batch_size * (int(lengths.sum()) / len(lengths))
    total = np.cumsum(lengths)
    start = np.searchsorted(group, group, side="left")
    fits = total - (total - lengths)[start] <= share  # the group's tokens up to this turn fit the share
    first = fits & (np.arange(len(group)) - start < FOCUS_TURN_CAP)
    sweep = np.where(first, 0, np.where(fits, 1, 2))  # first pass, relaxing (no turn cap), fill (no cap)
    return order[np.lexsort((group, sweep))[:batch_size]]


def task_balance_weights(selected: Columns) -> list[float]:
    """Per-row loss weights ``B / (G · n_g)``: every task group of the batch weighs ``B / G``; the weights average 1."""
    keys = selected.task.tolist()
    counts = Counter(keys)
    return [len(keys) / (len(counts) * counts[k]) for k in keys]
