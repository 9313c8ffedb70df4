"""Property tests of the sampler (hypothesis): random arrival/consumption programs against the paper's guarantees."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from divopd import gate
from divopd.sampling import METHODS, Candidate, Columns, Ledger, SamplerConfig, make_sampler
from sampler_helpers import focus_key, slots, turn

BUILTIN = ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "top-b", "divopd-focus")
GATED = BUILTIN[1:-1]  # divopd-focus has no gate
DEFECT_KINDS = [None] * 6 + ["prompt_truncated", "missing_teacher", "length_mismatch", "no_valid_token", "nan_teacher"]
FAST = settings(max_examples=250, deadline=None)

# A turn spec: (rollout, version lag behind the learner, response length, focus score, defect).
turn_spec = st.tuples(
    st.integers(0, 6), st.integers(0, 3), st.integers(1, 4), st.integers(-3, 3), st.sampled_from(DEFECT_KINDS)
)
# An op: add a list of turns, or ask for a batch after the learner advanced by 0-2 versions.
op = st.one_of(
    st.tuples(st.just("add"), st.lists(turn_spec, min_size=1, max_size=12)),
    st.tuples(st.just("next"), st.integers(0, 2)),
)
program = st.lists(op, min_size=1, max_size=14)


@st.composite
def configs(draw, methods=BUILTIN) -> SamplerConfig:
    return SamplerConfig(
        method=draw(st.sampled_from(methods)),
        batch_size=draw(st.integers(1, 6)),
        pool_factor=draw(st.sampled_from([1, 1.5, 2, 4])),
        cap=draw(st.integers(1, 3)),
        max_staleness=draw(st.integers(0, 2)),
        max_pending=draw(st.one_of(st.none(), st.integers(0, 8))),
        seed=draw(st.integers(0, 3)),
        max_pending_age=draw(st.one_of(st.none(), st.integers(0, 3))),
    )


class Run:
    """Feeds one program to several samplers in lockstep, building each arriving turn once."""

    def __init__(self, samplers: list) -> None:
        self.samplers = samplers
        self.learner = 0
        self.turn_counter: Counter = Counter()

    def apply(self, op_: tuple) -> list:
        kind, arg = op_
        if kind == "add":
            turns = []
            for rollout, lag, n, score, defect in arg:
                rid = f"r{rollout}"
                turns.append(turn(rid, self.turn_counter[rid], max(0, self.learner - lag), n, score, defect))
                self.turn_counter[rid] += 1
            for s in self.samplers:
                s.add(turns)
            return [None] * len(self.samplers)
        self.learner += arg
        return [s.next_batch(self.learner) for s in self.samplers]


def ledger_identity(ledger: Ledger) -> bool:
    parts = ledger.selected + ledger.expired + ledger.invalid + ledger.pending + ledger.queued
    return ledger.received == parts and sum(ledger.invalid_by_reason.values()) == ledger.invalid


def check_batch(config: SamplerConfig, batch, learner: int) -> None:
    """Every guarantee one batch must meet, for its method."""
    B, k, method = config.batch_size, config.cap, config.method
    turns = batch.payloads
    assert len(turns) == B == len(batch.arrivals) == len(set(batch.arrivals))
    assert all(learner - t.policy_version <= config.max_staleness for t in turns), "stale turn selected"
    if method == "vanilla":
        assert batch.arrivals == sorted(batch.arrivals)
        return
    if method == "divopd-focus":  # no gate: invalid turns are candidates; the weights balance the tasks
        assert all(learner - t.policy_version <= config.max_staleness for t in batch.candidates)
        assert len(batch.candidates) <= config.pool_size
        assert batch.row_weights is not None and len(batch.row_weights) == B
        assert math.isclose(sum(batch.row_weights), B)
        return
    assert all(gate.check(t) is None for t in turns), "invalid turn selected"
    cands = batch.candidates
    assert all(gate.check(t) is None and learner - t.policy_version <= config.max_staleness for t in cands)
    assert len(cands) <= config.pool_size
    oldest: dict[str, int] = {}  # Algorithm 1, step 4: oldest first-seen update, ties by rollout id
    for t, seen in zip(cands, batch.first_seen, strict=True):
        oldest[t.rollout_id] = min(seen, oldest.get(t.rollout_id, seen))
    assert all(seen <= learner for seen in batch.first_seen)
    groups = sorted(oldest, key=lambda rid: (oldest[rid], rid))
    per_group = Counter(t.rollout_id for t in cands)
    taken = Counter(t.rollout_id for t in turns)
    if method in ("divopd", "divopd-base"):
        need = math.ceil(B / k)
        assert len(taken) >= min(need, len(groups)), "fewer than ceil(B/k) rollouts"
        alloc = slots([per_group[g] for g in groups], B, k)
        assert [taken[g] for g in groups] == alloc
    if method == "nocap":
        alloc = slots([per_group[g] for g in groups], B, None)
        assert [taken[g] for g in groups] == alloc
    if method == "divopd":  # focus: each rollout's slots hold its top turns, in focus order
        for rid in taken:
            mine = [t for t in turns if t.rollout_id == rid]
            ranked = sorted((t for t in cands if t.rollout_id == rid), key=focus_key)
            assert [t.key for t in mine] == [t.key for t in ranked[: len(mine)]]
    if method == "top-b":
        assert [t.key for t in turns] == [t.key for t in sorted(cands, key=focus_key)[:B]]
    if method == "vanilla-pool":
        assert [id(t) for t in turns] == [id(t) for t in cands[:B]]


@FAST
@given(config=configs(), prog=program)
def test_invariants_hold_after_any_program(config: SamplerConfig, prog: list) -> None:
    s = make_sampler(config)
    run = Run([s])
    seen: set[int] = set()
    batches = 0
    for op_ in prog:
        (batch,) = run.apply(op_)
        if batch is not None:
            batches += 1
            check_batch(config, batch, run.learner)
            assert seen.isdisjoint(batch.arrivals), "a turn selected twice"
            seen.update(batch.arrivals)
            assert batch.stats["pending"] == s.ledger.pending
        ledger = s.ledger
        assert ledger_identity(ledger)
        assert ledger.selected == batches * config.batch_size
        if config.max_pending is not None and batch is not None:
            assert ledger.pending <= config.max_pending


@settings(max_examples=100, deadline=None)
@given(config=configs(), prog=program)
def test_same_seed_same_batches(config: SamplerConfig, prog: list) -> None:
    a, b = make_sampler(config), make_sampler(config)
    run = Run([a, b])
    for op_ in prog:
        x, y = run.apply(op_)
        assert (x is None) == (y is None)
        if x is not None:
            assert x.arrivals == y.arrivals and x.stats == y.stats
        assert a.ledger == b.ledger


@settings(max_examples=100, deadline=None)
@given(config=configs(), prog=program, split=st.integers(0, 14))
def test_state_dict_json_round_trip_continues_identically(config: SamplerConfig, prog: list, split: int) -> None:
    original = make_sampler(config)
    run = Run([original])
    split = min(split, len(prog))
    for op_ in prog[:split]:
        run.apply(op_)
    restored = make_sampler(config)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.ledger == original.ledger
    run.samplers = [original, restored]
    for op_ in prog[split:]:
        x, y = run.apply(op_)
        assert (x is None) == (y is None)
        if x is not None:
            assert x.arrivals == y.arrivals and [t.key for t in x.payloads] == [t.key for t in y.payloads]
            assert x.stats == y.stats
        assert original.ledger == restored.ledger


pool_entry = st.tuples(st.integers(0, 7), st.integers(-4, 4))  # (rollout, score)


@settings(max_examples=150, deadline=None)
@given(
    entries=st.lists(pool_entry, min_size=1, max_size=40),
    batch_size=st.integers(1, 12),
    cap=st.integers(1, 4),
    seed=st.integers(0, 100),
)
def test_divopd_and_divopd_base_allocate_identically_on_the_same_pool(entries, batch_size, cap, seed) -> None:
    counter: Counter = Counter()
    pool = []
    for arrival, (rollout, score) in enumerate(entries):
        rid = f"r{rollout}"
        pool.append((arrival, turn(rid, counter[rid], score=score)))
        counter[rid] += 1
    batch_size = min(batch_size, len(pool))
    config = SamplerConfig("divopd", batch_size, cap=cap, seed=seed)
    rng = np.random.default_rng(seed)
    columns = Columns.of([Candidate.of(t) for _, t in pool], [t for _, t in pool]).stamped(0)
    focus = columns.rollout_id[METHODS["divopd"].select(columns, batch_size, config, rng)].tolist()
    base = columns.rollout_id[METHODS["divopd-base"].select(columns, batch_size, config, rng)].tolist()
    assert Counter(focus) == Counter(base)
    assert focus == base  # the same layout too: composition order visits rollouts identically
    assert len(set(focus)) >= min(len(counter), math.ceil(batch_size / cap))


@settings(max_examples=60, deadline=None)
@given(prog=program, seed=st.integers(0, 3))
def test_divopd_and_divopd_base_first_batches_share_allocation(prog: list, seed: int) -> None:
    focus = make_sampler(SamplerConfig("divopd", 4, pool_factor=2, cap=1, seed=seed))
    base = make_sampler(SamplerConfig("divopd-base", 4, pool_factor=2, cap=1, seed=seed))
    run = Run([focus, base])
    for op_ in prog:
        x, y = run.apply(op_)
        if x is not None:  # same inputs so far, so the same pool: the same slots per rollout
            assert y is not None
            assert [t.rollout_id for t in x.payloads] == [t.rollout_id for t in y.payloads]
            return
