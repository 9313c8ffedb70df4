# ruff: noqa
"""The previous sampler's focus module, kept as the test oracle (docstrings dropped)."""
from __future__ import annotations
from collections.abc import Sequence
import numpy as np
from divopd.experience.turn import Turn
from divopd.sampling.config import SamplerConfig
from sampler_oracle.rules import focus_key
FOCUS_TURN_CAP = 3
FOCUS_TOKEN_SHARE = 0.25
Entry = tuple[int, Turn]

def task_key(turn: Turn) -> str:
    task = turn.info.get('task') if turn.info else None
    return f'task:{task}' if task is not None else f'rollout:{turn.rollout_id}'

def compose_divopd_focus(pool: list[Entry], batch_size: int, config: SamplerConfig | None, rng: np.random.Generator) -> list[Entry]:
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
    sweep(FOCUS_TURN_CAP, share)
    if len(out) < batch_size:
        sweep(None, share)
    if len(out) < batch_size:
        sweep(None, None)
    return out

def task_balance_weights(turns: Sequence[Turn]) -> list[float]:
    keys = [task_key(t) for t in turns]
    counts: dict[str, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    n, g = (len(turns), len(counts))
    return [n / (g * counts[k]) for k in keys]
