"""DivOPD-focus, the paper's *earlier* composer (Appendix A.1), as we read it.

The paper's whole description: "It has no validity gate, visits task groups in seeded random order, ranks turns by
disagreement, caps a group at three turns and a task's token share at 25% on the first pass, removes the turn cap when
relaxing, and enables per-rollout task-balance loss weights." It gives no code and no formula; our reading:

* **No gate.** Every non-stale turn read from the queue is a candidate, invalid ones too (the sampler's ``gated=False``
  method flag): an invalid turn that is selected is counted ``selected`` and trained as vanilla would train it (a
  dead row when it has no valid token; a truncated-prompt or logprob-less turn still trains on its valid tokens);
  an unselected one waits in the pending pool like any other candidate.
* **Task groups.** A turn's group is its task (``Candidate.task``: ``turn.info["task"]`` when the explorer recorded
  one, as every divopd explorer does, else its rollout id: a rollout is then its own task). Groups are visited in a
  seeded random order: the group names are sorted, then permuted once per composition with the sampler's rng.
* **Ranking.** Inside a group: disagreement s(u) descending, ties by ``(rollout_id, turn_index)``, then arrival.
* **First pass.** Each group, in visiting order, appends its best unselected turns while it holds fewer than
  :data:`FOCUS_TURN_CAP` (3) turns and the next turn keeps its selected response tokens within the *token share*:
  ``FOCUS_TOKEN_SHARE × B × mean response length of the candidates`` (25% of the response tokens a B-row batch of
  average candidates holds). A group stops at its first turn that does not fit (it takes a prefix of its ranking).
* **Relaxing.** If the batch is not full, one more sweep in the same order without the turn cap; the token share stays
  (the paper removes only the turn cap). If the batch is still not full, a last sweep without either cap fills it (the
  sampler needs exactly B rows whenever the pool holds B turns).
* **Task-balance loss weights** (:func:`task_balance_weights`): every row of task group g gets ``B / (G · n_g)``, with
  G the number of task groups in the batch and n_g the rows of group g, so each task's rows weigh ``B / G`` together
  (tasks contribute equally) and the weights average 1 over the batch. Rows of one rollout share its task's weight
  ("per-rollout"). The sampler puts them on ``Batch.row_weights``; the learner multiplies each row's
  seq-mean-token-mean term by its weight (:func:`divopd.learn.loss.reduce_tokens`).

Output order: by pass, then group visiting order, then rank inside the group.
"""

from __future__ import annotations

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
    """``divopd-focus``: no gate; task groups in seeded random order, each ranked by disagreement; a first pass of at
    most 3 turns and a 25% token share per group, then sweeps without the turn cap and finally without either cap."""
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
    counts: dict[str, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    n, g = len(keys), len(counts)
    return [n / (g * counts[k]) for k in keys]
