"""Token-share cap (``cap_unit: tokens``, beyond the paper): exact allocations, its guarantee, and the sampler path."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divopd.analysis.replay import ReplayConfig, replay
from divopd.experience.log import LoggedTurn
from divopd.sampling import SamplerConfig, make_sampler
from divopd.train.config import load_config
from sampler_helpers import slots, turn


# ---------------------------------------------------------------------------------------------------- by hand
def test_long_turns_get_fewer_slots_than_under_the_turn_cap() -> None:
    # mean length = (4·8 + 4·2 + 4·2) / 12 = 4, so k = 2 allows 8 tokens per rollout on the first pass:
    # A (8-token turns) takes 1 turn, B takes all 4 two-token turns (8 tokens), C takes 1 turn before B = 6 is reached.
    lens = [[8, 8, 8, 8], [2, 2, 2, 2], [2, 2, 2, 2]]
    assert slots(lens, 6, 2, tokens=True) == [1, 4, 1]
    assert slots([4, 4, 4], 6, 2) == [2, 2, 2]  # the paper's cap: A holds 16 of 24 tokens


def test_a_turn_longer_than_the_allowance_waits_for_a_later_pass() -> None:
    # mean = 16/3; pass 0 allows 5.33 tokens: A's 12-token turn waits, B takes 2 + 2. Pass 1 allows 10.67: still too
    # small for A. Pass 2 allows 16: A gets its turn.
    lens = [[12], [2, 2]]
    assert slots(lens, 2, 1, tokens=True) == [0, 2]
    assert slots(lens, 3, 1, tokens=True) == [1, 2]


def test_passes_raise_the_allowance_by_one_mean_length() -> None:
    # mean = 3; k = 1: pass 0 allows 3 tokens (one turn each), pass 1 allows 6 (two each), pass 2 allows 9.
    lens = [[3, 3, 3], [3, 3, 3]]
    assert slots(lens, 2, 1, tokens=True) == [1, 1]
    assert slots(lens, 3, 1, tokens=True) == [2, 1]
    assert slots(lens, 5, 1, tokens=True) == [3, 2]
    assert slots(lens, 9, 1, tokens=True) == [3, 3]  # more slots than turns: everything


def test_no_cap_and_bad_cap() -> None:
    lens = [[5, 1, 1], [9]]
    assert slots(lens, 3, None, tokens=True) == slots([3, 1], 3, None) == [3, 0]
    assert slots([], 4, 2, tokens=True) == []
    with pytest.raises(ValueError, match="cap"):
        slots(lens, 3, 0, tokens=True)


# ---------------------------------------------------------------------------------------------------- guarantee
groups = st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=8), min_size=1, max_size=30)


def first_pass_prefix(lens: list[int], allowance: float) -> int:
    """Turns a rollout can take on the first pass: the longest prefix whose token sum fits the allowance."""
    total = n = 0
    for length in lens:
        if total + length > allowance:
            break
        total += length
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(lens=groups, batch_size=st.integers(1, 120), cap=st.integers(1, 8))
def test_token_cap_guarantee(lens: list[list[int]], batch_size: int, cap: int) -> None:
    alloc = slots(lens, batch_size, cap, tokens=True)
    total_turns = sum(map(len, lens))
    assert sum(alloc) == min(batch_size, total_turns)  # the batch is always filled when there are turns
    assert all(0 <= a <= len(g) for a, g in zip(alloc, lens, strict=True))
    all_lens = [n for g in lens for n in g]
    allowance = cap * sum(all_lens) / len(all_lens)  # cap × mean response length of the candidates
    first = [first_pass_prefix(g, allowance) for g in lens]
    if sum(first) >= batch_size:  # enough rollouts pooled: the first pass fills the batch
        for a, f, g in zip(alloc, first, lens, strict=True):
            assert a <= f
            assert sum(g[:a]) <= allowance  # no rollout above cap × mean length tokens …
            assert sum(g[:a]) / (batch_size * allowance / cap) <= cap / batch_size + 1e-12  # … = k/B of the budget


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 10), min_size=1, max_size=30),
    length=st.integers(1, 50),
    batch_size=st.integers(1, 150),
    cap=st.integers(1, 8),
)
def test_equal_lengths_give_the_turn_cap(sizes: list[int], length: int, batch_size: int, cap: int) -> None:
    lens = [[length] * s for s in sizes]
    assert slots(lens, batch_size, cap, tokens=True) == slots(sizes, batch_size, cap)


# ---------------------------------------------------------------------------------------------------- sampler path
def hand_turns() -> list:
    """Rollout A: four 8-token turns; B and C: four 2-token turns each (the first hand case above)."""
    out = []
    for rid, n in (("A", 8), ("B", 2), ("C", 2)):
        out += [turn(rid, i, version=0, n=n, score=float(i)) for i in range(4)]
    return out


@pytest.mark.parametrize("method", ["divopd-base", "divopd"])
def test_sampler_honours_cap_unit_tokens(method: str) -> None:
    counts = {}
    for unit in ("turns", "tokens"):
        sampler = make_sampler(SamplerConfig(method, batch_size=6, pool_factor=2, cap=2, cap_unit=unit))
        sampler.add(hand_turns())
        batch = sampler.next_batch(0)
        assert batch is not None and len(batch) == 6
        counts[unit] = Counter(t.rollout_id for t in batch.payloads)
        assert sampler.ledger.selected == 6 and sampler.ledger.pending == 6
    assert counts["turns"] == {"A": 2, "B": 2, "C": 2}
    assert counts["tokens"] == {"A": 1, "B": 4, "C": 1}
    if method == "divopd":  # focus within the rollout: A's highest-disagreement turn
        sampler = make_sampler(SamplerConfig(method, batch_size=6, pool_factor=2, cap=2, cap_unit="tokens"))
        sampler.add(hand_turns())
        assert [t.turn_index for t in sampler.next_batch(0).payloads if t.rollout_id == "A"] == [3]


def test_replay_and_config_pass_cap_unit() -> None:
    logged = [LoggedTurn(t, i, 0) for i, t in enumerate(hand_turns())]
    shares = {}
    for unit in ("turns", "tokens"):
        cfg = ReplayConfig(methods=["divopd-base"], batch_size=6, pool_factor=2, cap=2, updates=1, cap_unit=unit)
        shares[unit] = replay(logged, cfg)["methods"]["divopd-base"]["max_rollout_share_mean"]
    assert shares["turns"] == pytest.approx(16 / 24)  # A: 2 × 8 of 2·8 + 2·2 + 2·2 tokens
    assert shares["tokens"] == pytest.approx(8 / 18)  # B: 4 × 2 … and A: 8 of 8 + 8 + 2
    assert load_config("tiny", ["method=divopd-base", "sampler.cap_unit=tokens"]).sampler_config().cap_unit == "tokens"
    with pytest.raises(ValueError, match="cap_unit"):
        load_config("tiny", ["method=divopd-base", "sampler.cap_unit=bytes"])


def test_token_cap_follows_the_visiting_order_not_the_arrival_order() -> None:
    """Rollout B (6 turns) arrives before A (2 turns) but A's id sorts first and both are first seen at update 0, so
    A is visited first (Algorithm 1, step 4). With equal lengths the token cap must give the turn cap's batch."""
    from divopd.sampling import SamplerConfig, make_sampler

    batches = {}
    from sampler_helpers import turn as hand_turn

    for unit in ("turns", "tokens"):
        s = make_sampler(SamplerConfig("divopd-base", 4, pool_factor=2, cap=2, cap_unit=unit, seed=1))
        s.add([hand_turn("B", i) for i in range(6)] + [hand_turn("A", i) for i in range(2)])
        batches[unit] = [t.rollout_id for t in s.next_batch(0).payloads]
    assert batches["turns"] == ["A", "A", "B", "B"] == batches["tokens"]
