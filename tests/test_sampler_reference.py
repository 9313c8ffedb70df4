"""The optimised composers against straightforward reference implementations of the same rules (exact equality).

The references are the plain versions: sort every rollout group by its key, allocate, then sort all slots by
(pass, visiting order, rank). Any speed-up of ``divopd.sampling.methods`` must keep returning exactly their output.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from divopd.sampling import METHODS, SamplerConfig
from divopd.sampling.methods import PoolColumns, compose_focus_first, compose_oldest, compose_rollout_first
from divopd.sampling.rules import (
    allocate_rollout_first,
    allocate_rollout_first_array,
    allocate_rollout_first_tokens,
    focus_key,
    slot_pass,
    uniform_order,
)
from sampler_helpers import turn


def reference_rollout_first(pool, batch_size, cap, within, rng, cap_unit="turns"):
    groups: dict = {}
    for entry in pool:
        groups.setdefault(entry[1].rollout_id, []).append(entry)
    ordered = list(groups.values())
    if within == "focus":
        for g in ordered:
            g.sort(key=lambda e: focus_key(e[1]))
    else:
        keys = uniform_order(len(pool), rng)
        key_of = {entry[0]: float(k) for entry, k in zip(pool, keys, strict=True)}
        for g in ordered:
            g.sort(key=lambda e: key_of[e[0]])
    if cap_unit == "tokens":
        alloc = allocate_rollout_first_tokens([[e[1].response_len for e in g] for g in ordered], batch_size, cap)
    else:
        alloc = allocate_rollout_first([len(g) for g in ordered], batch_size, cap)
    slots = sorted((slot_pass(rank, cap), gi, rank) for gi, n in enumerate(alloc) for rank in range(n))
    return [ordered[gi][rank] for _, gi, rank in slots]


def reference_focus_first(pool, batch_size):
    return sorted(pool, key=lambda e: focus_key(e[1]))[:batch_size]


# (rollout, turn index, score, response length): small ranges force ties in score and duplicate (rid, t) keys
entry_spec = st.tuples(st.integers(0, 9), st.integers(0, 5), st.integers(-2, 2), st.integers(1, 5))


def build_pool(specs):
    return [(arrival, turn(f"r{r}", t, n=n, score=s)) for arrival, (r, t, s, n) in enumerate(specs)]


@settings(max_examples=300, deadline=None)
@given(
    specs=st.lists(entry_spec, min_size=0, max_size=60),
    batch_size=st.integers(1, 30),
    cap=st.one_of(st.none(), st.integers(1, 5)),
    within=st.sampled_from(["focus", "uniform"]),
    cap_unit=st.sampled_from(["turns", "tokens"]),
    seed=st.integers(0, 50),
)
def test_rollout_first_matches_reference(specs, batch_size, cap, within, cap_unit, seed) -> None:
    pool = build_pool(specs)
    fast = compose_rollout_first(list(pool), batch_size, cap, within, np.random.default_rng(seed), cap_unit)
    ref = reference_rollout_first(list(pool), batch_size, cap, within, np.random.default_rng(seed), cap_unit)
    assert [e[0] for e in fast] == [e[0] for e in ref]
    assert len(fast) == min(batch_size, len(pool))


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(entry_spec, min_size=0, max_size=80), batch_size=st.integers(1, 30))
def test_focus_first_matches_reference(specs, batch_size) -> None:
    pool = build_pool(specs)
    config = SamplerConfig("top-b", batch_size)
    fast = compose_focus_first(list(pool), batch_size, config, np.random.default_rng(0))
    assert [e[0] for e in fast] == [e[0] for e in reference_focus_first(pool, batch_size)]


def test_oldest_is_by_arrival_even_for_an_unordered_pool() -> None:
    pool = build_pool([(0, 0, 0, 1)] * 5)[::-1]
    config = SamplerConfig("vanilla-pool", 3)
    assert [e[0] for e in compose_oldest(pool, 3, config, np.random.default_rng(0))] == [0, 1, 2]


def test_reference_agrees_with_the_hand_case() -> None:
    # sanity of the reference itself: sizes 5, 1, 4 with B = 6, k = 2 give [3, 1, 2]
    specs = [(0, i, 0, 1) for i in range(5)] + [(1, 0, 0, 1)] + [(2, i, 0, 1) for i in range(4)]
    ref = reference_rollout_first(build_pool(specs), 6, 2, "focus", None)
    assert Counter(e[1].rollout_id for e in ref) == {"r0": 3, "r1": 1, "r2": 2}


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 12), max_size=25),
    batch_size=st.integers(0, 80),
    cap=st.one_of(st.none(), st.integers(1, 6)),
)
def test_closed_form_allocation_equals_the_pass_loop(sizes, batch_size, cap) -> None:
    fast = allocate_rollout_first_array(sizes, batch_size, cap)
    assert fast.tolist() == allocate_rollout_first(sizes, batch_size, cap)


def columns_of(pool) -> PoolColumns:
    codes: dict = {}
    rows = [(a, t.policy_version, codes.setdefault(t.rollout_id, len(codes)), -t.disagreement, t.turn_index)
            for a, t in pool]
    return PoolColumns.from_rows(rows)


@settings(max_examples=300, deadline=None)
@given(
    specs=st.lists(entry_spec, min_size=1, max_size=60),
    batch_size=st.integers(1, 30),
    cap=st.integers(1, 5),
    method=st.sampled_from(["vanilla-pool", "nocap", "divopd-base", "divopd", "top-b"]),
    cap_unit=st.sampled_from(["turns", "tokens"]),
    seed=st.integers(0, 50),
)
def test_each_builtin_selector_equals_its_composer(specs, batch_size, cap, method, cap_unit, seed) -> None:
    pool = build_pool(specs)
    batch_size = min(batch_size, len(pool))
    config = SamplerConfig(method, batch_size, cap=cap, cap_unit=cap_unit)
    composed = METHODS[method].compose(list(pool), batch_size, config, np.random.default_rng(seed))
    positions = METHODS[method].select(dict(pool), columns_of(pool), batch_size, config, np.random.default_rng(seed))
    assert [pool[i][0] for i in positions.tolist()] == [e[0] for e in composed]
