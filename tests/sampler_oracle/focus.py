"""DivOPD-focus, the paper's *earlier* composer (Appendix A.1), as we read it.

The paper's whole description: "It has no validity gate, visits task groups in seeded random order, ranks turns by
disagreement, caps a group at three turns and a task's token share at 25% on the first pass, removes the turn cap when
relaxing, and enables per-rollout task-balance loss weights." It gives no code and no formula; our reading:

* **No gate.** Every non-stale turn read from the queue is a candidate, invalid ones too (the sampler's ``gated=False``
  method flag): an invalid turn that is selected is counted ``selected`` and trained as vanilla would train it (a
  dead row when it has no valid token; a truncated-prompt or logprob-less turn still trains on its valid tokens);
  an unselected one waits in the pending pool like any other candidate.
* **Task groups.** A turn's group is its task, ``turn.info["task"]`` when the explorer recorded one (every divopd
  explorer does), else its rollout id (a rollout is then its own task). Groups are visited in a seeded random order:
  the group names are sorted, then permuted once per composition with the sampler's rng (``rng.permutation``).
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

from collections.abc import Sequence

import numpy as np

from divopd.experience.turn import Turn
from sampler_oracle.config import SamplerConfig
from sampler_oracle.rules import focus_key

__all__ = ["FOCUS_TURN_CAP", "FOCUS_TOKEN_SHARE", "task_key", "compose_divopd_focus", "task_balance_weights"]

#: First-pass turn cap of a task group (the paper: "caps a group at three turns").
FOCUS_TURN_CAP = 3
#: First-pass (and relaxing-pass) token share of a task group (the paper: "a task's token share at 25%").
FOCUS_TOKEN_SHARE = 0.25

Entry = tuple[int, Turn]


def task_key(turn: Turn) -> str:
    """The turn's task group: ``"task:<info['task']>"``, or ``"rollout:<rollout_id>"`` without a recorded task."""
    task = turn.info.get("task") if turn.info else None
    return f"task:{task}" if task is not None else f"rollout:{turn.rollout_id}"


def compose_divopd_focus(
    pool: list[Entry], batch_size: int, config: SamplerConfig | None, rng: np.random.Generator
) -> list[Entry]:
    """``divopd-focus``: no gate; task groups in seeded random order, each ranked by disagreement; a first pass of at
    most 3 turns and a 25% token share per group, then sweeps without the turn cap and finally without either cap."""
    if batch_size <= 0 or not pool:
        return []
    members: dict[str, list[int]] = {}
    for i, (_, turn) in enumerate(pool):
        members.setdefault(task_key(turn), []).append(i)
    names = sorted(members)
    visit = [names[j] for j in rng.permutation(len(names)).tolist()]
    ranked = [sorted(members[g], key=lambda i: (*focus_key(pool[i][1]), pool[i][0])) for g in visit]
    lens = [turn.response_len for _, turn in pool]
    share = FOCUS_TOKEN_SHARE * batch_size * (sum(lens) / len(lens))
    taken = [0] * len(ranked)
    used = [0] * len(ranked)
    out: list[Entry] = []

    def sweep(turn_cap: int | None, token_cap: float | None) -> None:
        for g, group in enumerate(ranked):
            while len(out) < batch_size and taken[g] < len(group):
                if turn_cap is not None and taken[g] >= turn_cap:
                    break
                i = group[taken[g]]
                if token_cap is not None and used[g] + lens[i] > token_cap:
                    break
                out.append(pool[i])
                taken[g] += 1
                used[g] += lens[i]
            if len(out) == batch_size:
                return

    sweep(FOCUS_TURN_CAP, share)  # first pass
    if len(out) < batch_size:
        sweep(None, share)  # relaxing: the turn cap goes, the token share stays
    if len(out) < batch_size:
        sweep(None, None)  # fill: no cap left
    return out


def task_balance_weights(turns: Sequence[Turn]) -> list[float]:
    """Per-row loss weights ``B / (G · n_g)``: every task group of the batch weighs ``B / G``; the weights average 1."""
    keys = [task_key(t) for t in turns]
    counts: dict[str, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    n, g = len(turns), len(counts)
    return [n / (g * counts[k]) for k in keys]
