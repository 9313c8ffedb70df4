"""Exact small cases for every selection method, built by hand so that the right batch is known."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from divopd.sampling import (
    METHODS,
    SamplerConfig,
    focus_order,
    is_stale,
    make_sampler,
)
from sampler_helpers import keys, slots, turn


def sampler(method: str, batch_size: int, **kw):
    return make_sampler(SamplerConfig(method, batch_size, **kw))


# ---------------------------------------------------------------------------------------------------- the rules
def test_is_stale_is_strictly_beyond_the_window() -> None:
    assert not is_stale(3, 5, 2)
    assert is_stale(2, 5, 2)
    assert not is_stale(5, 5, 0) and is_stale(4, 5, 0)


@pytest.mark.parametrize(
    "sizes, batch_size, cap, expected",
    [
        # pass 0 (≤2 each): 2,1,2 = 5 ; pass 1 (≤3 each): the first group takes 1 more → 6
        ([5, 1, 4], 6, 2, [3, 1, 2]),
        ([5, 1, 4], 10, 2, [5, 1, 4]),  # everything fits
        ([5, 1, 4], 20, 2, [5, 1, 4]),  # fewer candidates than slots: all of them
        ([5, 1, 4], 3, 2, [2, 1, 0]),  # the batch fills during pass 0
        ([5, 5, 5], 4, 1, [2, 1, 1]),  # pass 0: 1,1,1 ; pass 1: first group
        ([5, 5, 5], 8, 1, [3, 3, 2]),
        ([0, 3, 2], 4, 1, [0, 2, 2]),
        ([5, 1, 4], 6, None, [5, 1, 0]),  # k = ∞: whole rollouts, oldest first
        ([2, 7, 1], 6, None, [2, 4, 0]),
        ([], 4, 2, []),
    ],
)
def test_allocate_rollout_first_by_hand(sizes, batch_size, cap, expected) -> None:
    assert slots(sizes, batch_size, cap) == expected


def test_allocate_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="cap"):
        slots([1], 1, 0)
    with pytest.raises(ValueError, match="batch_size"):
        slots([1], -1, 1)


def test_focus_order_is_disagreement_descending_ties_by_rollout_then_turn() -> None:
    turns = [turn("b", 0, score=2), turn("a", 1, score=2), turn("a", 0, score=1), turn("c", 0, score=3),
             turn("b", 1, score=-1), turn("a", 2, score=2)]
    order = focus_order(np.array([t.disagreement for t in turns]), np.array([t.rollout_id for t in turns]),
                        np.array([t.turn_index for t in turns]))
    assert keys([turns[i] for i in order]) == [("c", 0), ("a", 1), ("a", 2), ("b", 0), ("a", 0), ("b", 1)]


# ---------------------------------------------------------------------------------------------------- vanilla
def test_vanilla_reads_arrival_order_drops_stale_and_does_not_gate() -> None:
    s = sampler("vanilla", 3, max_staleness=1)
    s.add([turn("x", 0, version=0), turn("y", 0, version=2), turn("x", 1, version=1),
           turn("z", 0, version=2, defect="missing_teacher"), turn("y", 1, version=2)])
    batch = s.next_batch(2)
    assert batch is not None
    # ("x", 0) is stale (2 − 0 > 1); the invalid ("z", 0) is read as a dead row
    assert keys(batch.payloads) == [("y", 0), ("x", 1), ("z", 0)]
    assert batch.arrivals == [1, 2, 3]
    assert batch.stats["dead_rows"] == 1 and batch.stats["expired"] == 1 and batch.stats["invalid"] == 0
    ledger = s.ledger
    assert (ledger.received, ledger.selected, ledger.expired, ledger.invalid) == (5, 3, 1, 0)
    assert (ledger.pending, ledger.queued) == (0, 1)
    assert s.next_batch(2) is None
    assert s.ledger.queued == 1


# ---------------------------------------------------------------------------------------------------- vanilla-pool
def test_vanilla_pool_gates_then_takes_the_oldest_valid_turns() -> None:
    s = sampler("vanilla-pool", 2, pool_factor=2)
    s.add([turn("r1", 0, defect="prompt_truncated"), turn("r1", 1), turn("r0", 0), turn("r2", 0), turn("r1", 2),
           turn("r3", 0), turn("r3", 1)])
    b1 = s.next_batch(0)
    assert keys(b1.payloads) == [("r1", 1), ("r0", 0)] and b1.arrivals == [1, 2]
    # Algorithm 1, step 2: the invalid turn uses up one of the c·B = 4 reads, so 3 valid candidates, 1 left pending
    assert b1.stats["invalid"] == 1 and b1.stats["candidates"] == 3 and b1.stats["pending"] == 1
    assert b1.stats["candidate_rollouts"] == 3  # r1, r0, r2 (the invalid r1 turn is not a candidate)
    assert s.ledger.invalid_by_reason["prompt_truncated"] == 1
    b2 = s.next_batch(0)
    assert keys(b2.payloads) == [("r2", 0), ("r1", 2)]  # pending first: the oldest
    b3 = s.next_batch(0)
    assert keys(b3.payloads) == [("r3", 0), ("r3", 1)]
    assert s.next_batch(0) is None


# ---------------------------------------------------------------------------------------------------- nocap
def _three_rollouts() -> list:
    # arrival order interleaves rollouts; visiting order (one first-seen update, then rollout id) is A, B, C
    return [turn("A", 0), turn("B", 0), turn("A", 1), turn("B", 1), turn("C", 0), turn("A", 2), turn("C", 1),
            turn("C", 2)]


@pytest.mark.parametrize("seed", range(5))
def test_nocap_takes_whole_rollouts_oldest_first(seed: int) -> None:
    s = sampler("nocap", 4, pool_factor=2, seed=seed)
    s.add(_three_rollouts())
    batch = s.next_batch(0)
    ks = keys(batch.payloads)
    assert sorted(ks[:3]) == [("A", 0), ("A", 1), ("A", 2)]  # rollout A whole, first
    assert ks[3] in {("B", 0), ("B", 1)}  # then one (uniformly drawn) turn of B
    assert batch.stats["distinct_rollouts"] == 2


def test_nocap_within_rollout_order_is_uniform_over_seeds() -> None:
    firsts = Counter()
    for seed in range(60):
        s = sampler("nocap", 4, pool_factor=2, seed=seed)
        s.add(_three_rollouts())
        firsts[keys(s.next_batch(0).payloads)[3]] += 1
    assert set(firsts) == {("B", 0), ("B", 1)}  # both turns of B get drawn


# ---------------------------------------------------------------------------------------------------- cap methods
def _sizes_5_1_4() -> list:
    # One composition reads them all (one first-seen update), so groups go by rollout id: "a", then "b", then "c"
    # (arrivals interleaved).
    a_scores = [1, 5, 3, 5, 0]
    c_scores = [2, 4, 4, 9]
    arrivals = [("a", 0), ("b", 0), ("a", 1), ("c", 0), ("a", 2), ("c", 1), ("a", 3), ("c", 2), ("a", 4), ("c", 3)]
    score = {("a", i): s for i, s in enumerate(a_scores)} | {("c", i): s for i, s in enumerate(c_scores)}
    score[("b", 0)] = -3
    return [turn(r, i, score=score[(r, i)]) for r, i in arrivals]


def test_divopd_cap_passes_and_focus_by_hand() -> None:
    s = sampler("divopd", 6, cap=2, pool_factor=2)
    s.add(_sizes_5_1_4())
    batch = s.next_batch(0)
    # allocation [3, 1, 2]; a by focus: t1 (5), t3 (5, tie → lower turn index after), t2 (3); c: t3 (9), t1 (4)
    # composition order: pass 0 → a rank 0,1, b rank 0, c rank 0,1; pass 1 → a rank 2
    assert keys(batch.payloads) == [("a", 1), ("a", 3), ("b", 0), ("c", 3), ("c", 1), ("a", 2)]
    assert batch.stats["distinct_rollouts"] == 3
    assert s.ledger.pending == 4


@pytest.mark.parametrize("seed", range(4))
def test_divopd_base_same_allocation_uniform_turns(seed: int) -> None:
    s = sampler("divopd-base", 6, cap=2, pool_factor=2, seed=seed)
    s.add(_sizes_5_1_4())
    batch = s.next_batch(0)
    rids = [t.rollout_id for t in batch.payloads]
    assert Counter(rids) == {"a": 3, "b": 1, "c": 2}
    assert rids == ["a", "a", "b", "c", "c", "a"]  # same pass/visit layout as divopd
    assert len(set(keys(batch.payloads))) == 6


def test_divopd_base_draws_differ_between_seeds() -> None:
    picks = set()
    for seed in range(20):
        s = sampler("divopd-base", 6, cap=2, pool_factor=2, seed=seed)
        s.add(_sizes_5_1_4())
        picks.add(tuple(keys(s.next_batch(0).payloads)))
    assert len(picks) > 1


def test_nocap_on_the_same_pool_fills_from_the_oldest_rollout() -> None:
    s = sampler("nocap", 6, cap=2, pool_factor=2)
    s.add(_sizes_5_1_4())
    rids = [t.rollout_id for t in s.next_batch(0).payloads]
    assert Counter(rids) == {"a": 5, "b": 1}


def test_pending_turns_of_a_rollout_keep_their_place_in_the_visiting_order() -> None:
    # B=2, k=1: pass 0 gives a (first) its best turn and b one turn; the rest stays pending
    s = sampler("divopd", 2, cap=1, pool_factor=3)
    s.add([turn("a", 0, score=1), turn("a", 1, score=2), turn("b", 0), turn("a", 2, score=3), turn("c", 0),
           turn("d", 0)])
    assert keys(s.next_batch(0).payloads) == [("a", 2), ("b", 0)]
    # pool: a0 a1 c0 d0 (pending, all first seen at update 0): a still comes first, then c, then d
    assert keys(s.next_batch(0).payloads) == [("a", 1), ("c", 0)]


# ---------------------------------------------------------------------------------------------------- top-b
def test_top_b_ranks_all_candidates_globally() -> None:
    s = sampler("top-b", 3, pool_factor=2)
    s.add([turn("b", 0, score=2), turn("a", 1, score=2), turn("a", 0, score=1), turn("c", 0, score=3),
           turn("b", 1, score=-1), turn("d", 0, score=8, defect="no_valid_token")])
    batch = s.next_batch(0)
    assert keys(batch.payloads) == [("c", 0), ("a", 1), ("b", 0)]
    assert s.ledger.invalid_by_reason["no_valid_token"] == 1


# ---------------------------------------------------------------------------------------------------- across methods
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_expires_stale_pending_and_queued_turns(method: str) -> None:
    s = sampler(method, 2, pool_factor=2, max_staleness=1)
    s.add([turn("a", i, version=0) for i in range(3)] + [turn("b", 0, version=1)])
    first = s.next_batch(0)
    assert first is not None
    s.add([turn("c", 0, version=2), turn("c", 1, version=2)])
    second = s.next_batch(2)  # every version-0 turn is now stale, wherever it waits
    assert second is not None
    assert all(2 - t.policy_version <= 1 for t in second.payloads)
    ledger = s.ledger
    assert ledger.selected + ledger.expired + ledger.pending + ledger.queued == 6
    assert ledger.expired >= 1 and ledger.expired_by_reason["stale"] == ledger.expired


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_returns_exactly_batch_size_rows(method: str) -> None:
    s = sampler(method, 5, pool_factor=1.5, seed=3)
    rng = np.random.default_rng(0)
    s.add([turn(f"r{rng.integers(4)}", i, score=float(rng.integers(-3, 4))) for i in range(40)])
    for _ in range(5):
        batch = s.next_batch(0)
        assert batch is not None and len(batch) == 5 and len(set(batch.arrivals)) == 5
    ledger = s.ledger
    assert ledger.selected == 25
