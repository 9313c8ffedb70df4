"""The replay's rules: which logged turns a tick delivers (:func:`deliveries`) and which rollouts count as covered
(:func:`rollout_coverage`, Table 11). :mod:`divopd.analysis.replay` runs the samplers over them."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import divopd.sampling.paper_diagnostics as pd
from divopd.experience.log import LoggedTurn
from divopd.sampling import Sampler

__all__ = ["deliveries", "log_updates", "rollout_coverage", "waiting_rollouts", "cell_counts"]


def deliveries(stream: Iterable[LoggedTurn], updates: int) -> Iterator[tuple[int, list[LoggedTurn]]]:
    """Replay's delivery rule: yields ``(j, turns)`` for every tick ``j`` in ``0…U−1``, ``turns`` the not-yet-delivered
    ones with ``arrival_update ≤ j`` in arrival order (maybe none). Raises ``ValueError`` on a stream out of arrival
    order; reading stops at the first turn with ``arrival_update ≥ U`` (never delivered)."""
    it = iter(stream)
    nxt = next(it, None)
    last: LoggedTurn | None = None
    for j in range(updates):
        batch: list[LoggedTurn] = []
        while nxt is not None and nxt.arrival_update <= j:
            if last is not None and (nxt.arrival <= last.arrival or nxt.arrival_update < last.arrival_update):
                raise ValueError(f"replay input out of order: (arrival {nxt.arrival}, arrival_update "
                                 f"{nxt.arrival_update}) after (arrival {last.arrival}, arrival_update "
                                 f"{last.arrival_update})")
            if nxt.arrival_update < 0:
                raise ValueError(f"replay input: negative arrival_update {nxt.arrival_update} at arrival {nxt.arrival}")
            batch.append(nxt)
            last = nxt
            nxt = next(it, None)
        yield j, batch


def log_updates(path: str | os.PathLike) -> int:
    """``max(arrival_update) + 1`` of a log (reads only that column): the default number of ticks."""
    from divopd.experience.log import iter_record_batches

    last = -1
    for batch in iter_record_batches(path, columns=["arrival_update"], validate=False):
        if batch.num_rows:
            last = max(last, int(batch.column("arrival_update").to_numpy().max()))
    return last + 1


def waiting_rollouts(sampler: Sampler) -> Counter[str]:
    """Rollout id -> number of its turns still waiting (pending or queued) in ``sampler``, from its public state."""
    state = sampler.state_dict()
    counts: Counter[str] = Counter()
    for key in ("queue", "pending"):
        if key not in state:
            raise RuntimeError(f"sampler state_dict has no {key!r} entry; replay cannot tell which turns still wait")
        for _, turn, *_ in state[key]:  # pending entries also carry their first-seen update
            counts[turn["rollout_id"]] += 1
    return counts


def rollout_coverage(valid: set[str], used: set[str], waiting: Counter[str]) -> dict[str, Any]:
    """Table 11's coverage rule over ``valid`` (rollouts with a delivered turn that passes the gate), ``used`` (with a
    selected turn) and ``waiting`` (rollout -> turns still pending or queued at the end): ``valid_rollouts``,
    ``used_rollouts`` (valid ∧ used), ``undecided_rollouts`` (valid with a turn still waiting) and ``unused_fraction`` =
    |valid ∧ decided ∧ ¬used| ÷ |valid ∧ decided| (``None`` when no valid rollout is decided)."""
    undecided = {r for r in valid if waiting.get(r, 0) > 0}
    decided = valid - undecided
    unused = decided - used
    return {
        "valid_rollouts": len(valid),
        "used_rollouts": len(valid & used),
        "undecided_rollouts": len(undecided),
        "unused_fraction": (len(unused) / len(decided)) if decided else None,
    }


def cell_counts(cells: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """``{bucket: {outcome: count}}``: every bucket, and the outcomes that :func:`~pd.cell_shares` shows."""
    shares = pd.cell_shares(cells)
    return {b: {o: cells.get((b, o), 0) for o in row} for b, row in shares.items()}
