"""Ledger, pending overflow, empty calls, batch statistics, configuration errors, registry and state round trip."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest

from divopd.errors import UsageError
from divopd.sampling import (
    METHODS,
    Candidate,
    Ledger,
    SamplerConfig,
    batch_stats,
    effective_rollouts,
    make_sampler,
    register_method,
)
from sampler_helpers import keys, turn

LEDGER_KEYS = {"received", "selected", "expired", "invalid", "pending", "queued", "invalid_by_reason"}


def identity_holds(ledger: Ledger) -> bool:
    parts = ledger.selected + ledger.expired + ledger.invalid + ledger.pending + ledger.queued
    return ledger.received == parts


# ---------------------------------------------------------------------------------------------------- ledger
def test_ledger_has_the_issue_s_keys_and_starts_at_zero() -> None:
    ledger = make_sampler(SamplerConfig("divopd", 4)).ledger
    assert LEDGER_KEYS <= set(asdict(ledger))
    assert all(getattr(ledger, k) == 0 for k in LEDGER_KEYS - {"invalid_by_reason"})
    assert all(v == 0 for v in ledger.invalid_by_reason.values())


def test_max_pending_overflow_drops_the_oldest_pending_turns_as_expired() -> None:
    s = make_sampler(SamplerConfig("vanilla-pool", 2, pool_factor=4, max_pending=3))
    s.add([turn(f"r{i}", 0) for i in range(8)])
    batch = s.next_batch(0)
    assert batch.arrivals == [0, 1]
    # 6 unselected valid turns, 3 allowed: arrivals 2, 3, 4 expire; 5, 6, 7 stay pending
    assert batch.stats["expired"] == 3 and batch.stats["pending"] == 3
    ledger = s.ledger
    assert (ledger.selected, ledger.expired, ledger.pending) == (2, 3, 3)
    assert ledger.expired_by_reason == {"stale": 0, "pending_age": 0, "pending_overflow": 3}
    assert s.next_batch(0).arrivals == [5, 6]
    assert identity_holds(s.ledger)


def test_max_pending_zero_keeps_nothing_between_compositions() -> None:
    s = make_sampler(SamplerConfig("divopd", 2, pool_factor=2, max_pending=0))
    s.add([turn("a", i) for i in range(5)])
    s.next_batch(0)
    assert s.ledger.pending == 0 and s.ledger.expired == 2 and s.ledger.queued == 1


@pytest.mark.parametrize("method", sorted(METHODS))
def test_none_selects_nothing(method: str) -> None:
    s = make_sampler(SamplerConfig(method, 4, pool_factor=2))
    s.add([turn("a", 0), turn("a", 1), turn("b", 0, defect="missing_teacher"), turn("c", 0)])
    if method == "vanilla":  # the reader takes invalid turns as rows: 4 queued turns make a batch
        s.add(turn("d", 0))
        assert s.next_batch(0) is not None
        assert s.next_batch(0) is None and s.ledger.queued == 1 and s.ledger.selected == 4
        return
    if not METHODS[method].gated:  # divopd-focus: no gate, the invalid turn is a candidate and is selected
        batch = s.next_batch(0)
        assert batch is not None and ("b", 0) in keys(batch.payloads)
        assert (s.ledger.selected, s.ledger.invalid, s.ledger.pending) == (4, 0, 0)
        return
    assert s.next_batch(0) is None
    ledger = s.ledger
    # nothing selected; the gate has read the queue: 3 valid turns wait as pending, 1 was rejected with its reason
    assert (ledger.selected, ledger.pending, ledger.invalid, ledger.queued) == (0, 3, 1, 0)
    assert ledger.invalid_by_reason["missing_teacher"] == 1
    s.add(turn("e", 0))
    batch = s.next_batch(0)
    assert batch is not None and set(keys(batch.payloads)) == {("a", 0), ("a", 1), ("c", 0), ("e", 0)}


def test_add_is_all_or_nothing_on_a_bad_item() -> None:
    s = make_sampler(SamplerConfig("divopd", 2))
    with pytest.raises(TypeError, match="Turn"):
        s.add([turn("a", 0), {"rollout_id": "b"}])
    assert s.ledger.received == 0 and s.ledger.queued == 0
    assert s.add(turn("a", 0)) == [0]
    assert identity_holds(s.ledger)


def test_learner_version_must_be_an_int() -> None:
    s = make_sampler(SamplerConfig("divopd", 2))
    with pytest.raises(TypeError, match="learner_version"):
        s.next_batch(1.5)


# ---------------------------------------------------------------------------------------------------- statistics
def test_effective_rollouts_is_inverse_sum_of_squared_shares() -> None:
    assert effective_rollouts([0.75, 0.25]) == pytest.approx(1.6)
    assert effective_rollouts([0.25] * 4) == pytest.approx(4.0)
    assert effective_rollouts([1.0]) == 1.0
    assert effective_rollouts([]) == 0.0


def _stats_turns() -> list:
    return [
        turn("r0", 0, version=3, n=2, score=1.0),
        turn("r0", 1, version=2, n=4, score=2.0),
        turn("r1", 0, version=1, n=2, defect="no_valid_token"),
    ]


def test_batch_stats_by_hand() -> None:
    stats = batch_stats([Candidate.of(t) for t in _stats_turns()], learner_version=3)
    # tokens: r0 = 2 + 4 = 6, r1 = 2 → shares 0.75, 0.25 → 1 / (0.5625 + 0.0625) = 1.6
    assert stats["rows"] == 3 and stats["distinct_rollouts"] == 2
    assert stats["effective_rollouts"] == pytest.approx(1.6)
    assert stats["max_rollout_share"] == pytest.approx(0.75)
    assert stats["dead_rows"] == 1
    assert stats["response_tokens"] == 8 and stats["valid_tokens"] == 6
    assert stats["mean_staleness"] == pytest.approx(1.0) and stats["max_staleness"] == 2  # 0, 1, 2
    assert (stats["version_min"], stats["version_max"]) == (1, 3)
    assert stats["disagreement_mean"] == pytest.approx(1.0)  # (1 + 2 + 0) / 3 rows
    assert stats["disagreement_std_across_rollouts"] == pytest.approx(1.5)  # per rollout 3 and 0


def test_batch_stats_through_a_sampler_add_call_counters() -> None:
    s = make_sampler(SamplerConfig("vanilla", 3, max_staleness=2))
    s.add([turn("old", 0, version=0)] + _stats_turns() + [turn("r2", 0, version=3)])
    batch = s.next_batch(3)
    assert keys(batch.payloads) == [("r0", 0), ("r0", 1), ("r1", 0)]
    assert batch.stats["effective_rollouts"] == pytest.approx(1.6)
    assert batch.stats["dead_rows"] == 1 and batch.stats["mean_staleness"] == pytest.approx(1.0)
    counters = (batch.stats["expired"], batch.stats["invalid"], batch.stats["pending"], batch.stats["queued"])
    assert counters == (1, 0, 0, 1)


def test_gated_batches_have_no_dead_rows() -> None:
    s = make_sampler(SamplerConfig("divopd", 3, max_staleness=2))
    s.add(_stats_turns() + [turn("r2", 0, version=3)])
    batch = s.next_batch(3)
    assert batch.stats["dead_rows"] == 0 and batch.stats["invalid"] == 1


def test_batch_stats_of_an_empty_batch() -> None:
    assert batch_stats([], 0)["rows"] == 0


# ---------------------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="nope", batch_size=4), "unknown sampler method 'nope'"),
        (dict(method=["divopd"], batch_size=4), "unknown sampler method"),
        (dict(method="divopd", batch_size=0), "batch_size"),
        (dict(method="divopd", batch_size=2.0), "batch_size"),
        (dict(method="divopd", batch_size=4, cap=0), "cap"),
        (dict(method="divopd", batch_size=4, pool_factor=0.5), "pool_factor"),
        (dict(method="divopd", batch_size=4, pool_factor=math.nan), "pool_factor"),
        (dict(method="divopd", batch_size=4, pool_factor="4"), "pool_factor"),
        (dict(method="divopd", batch_size=4, max_staleness=-1), "max_staleness"),
        (dict(method="divopd", batch_size=4, max_pending=-1), "max_pending"),
        (dict(method="divopd", batch_size=4, seed=-1), "seed"),
        (dict(method="divopd", batch_size=4, cap_unit="bytes"), "cap_unit"),
    ],
)
def test_bad_configs_raise_value_error_naming_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplerConfig(**kwargs)


def test_pool_size_is_ceil_of_c_times_b_without_float_noise() -> None:
    assert SamplerConfig("divopd", 256, pool_factor=4).pool_size == 1024
    assert SamplerConfig("divopd", 3, pool_factor=1.5).pool_size == 5
    assert SamplerConfig("divopd", 100, pool_factor=1.1).pool_size == 110  # 1.1 * 100 = 110.00000000000001


def test_make_sampler_wants_a_config() -> None:
    with pytest.raises(TypeError, match="SamplerConfig"):
        make_sampler({"method": "divopd"})


def test_register_method_plugs_a_new_rule_in_everywhere() -> None:
    def newest(pool, batch_size, config, rng):
        return np.argsort(-pool.arrival)[:batch_size]

    register_method("test-newest", newest, "the B newest candidates")
    try:
        assert METHODS["test-newest"].pooled
        s = make_sampler(SamplerConfig("test-newest", 2, pool_factor=2))
        s.add([turn("a", i, defect="missing_teacher" if i == 3 else None) for i in range(6)])
        # the c·B = 4 read is a0 a1 a2 a3; a3 is rejected (Algorithm 1, step 2): the pool is a0 a1 a2
        assert keys(s.next_batch(0).payloads) == [("a", 2), ("a", 1)]
        with pytest.raises(ValueError, match="already registered"):
            register_method("test-newest", newest)
    finally:
        METHODS.pop("test-newest", None)
    with pytest.raises(ValueError, match="non-empty"):
        register_method("", newest)


@pytest.mark.parametrize(
    "compose, match",
    [
        (lambda pool, b, c, r: np.arange(b - 1), "returned 1 rows"),
        (lambda pool, b, c, r: np.zeros(b, dtype=int), "twice"),
        (lambda pool, b, c, r: np.array([999, 1]), "not in the candidate pool"),
    ],
)
def test_a_misbehaving_method_is_caught(compose, match: str) -> None:
    register_method("test-bad", compose)
    try:
        s = make_sampler(SamplerConfig("test-bad", 2, pool_factor=2))
        s.add([turn("a", i) for i in range(4)])
        with pytest.raises(RuntimeError, match=match):
            s.next_batch(0)
    finally:
        METHODS.pop("test-bad", None)


# ---------------------------------------------------------------------------------------------------- state
@pytest.mark.parametrize("method", sorted(METHODS))
def test_state_dict_json_round_trip_continues_identically(method: str) -> None:
    config = SamplerConfig(method, 3, pool_factor=2, cap=1, max_staleness=1, max_pending=4, seed=7)
    s = make_sampler(config)
    s.add([turn(f"r{i % 3}", i, version=i % 2, score=(i * 7) % 5, defect="nan_teacher" if i == 4 else None)
           for i in range(14)])
    s.next_batch(1)
    restored = make_sampler(config)
    restored.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert restored.ledger == s.ledger
    for step, version in enumerate([1, 2, 2, 3]):
        more = [turn("late", 100 + 2 * step + j, version=version) for j in range(2)]
        s.add(more)
        restored.add(more)
        a, b = s.next_batch(version), restored.next_batch(version)
        assert (a is None) == (b is None)
        if a is not None:
            assert a.arrivals == b.arrivals and keys(a.payloads) == keys(b.payloads) and a.stats == b.stats
        assert s.ledger == restored.ledger


def test_load_state_dict_rejects_another_config() -> None:
    s = make_sampler(SamplerConfig("divopd", 3))
    with pytest.raises(UsageError, match="saved with"):
        make_sampler(SamplerConfig("divopd", 4)).load_state_dict(s.state_dict())


@pytest.mark.parametrize("version", [1, 2, 99, None])
def test_a_state_of_another_version_is_refused_with_one_line_naming_it(version) -> None:
    s = make_sampler(SamplerConfig("divopd", 3))
    s.add([turn("a", 0)])
    state = {**s.state_dict(), "version": version}
    with pytest.raises(UsageError) as err:
        make_sampler(SamplerConfig("divopd", 3)).load_state_dict(state)
    assert f"sampler state version {version!r}" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_payload_is_selected_departed_or_waiting_exactly_once(method: str) -> None:
    """A caller holding records beside the sampler (a plug-in) gets each one back exactly once: in a batch, from
    ``take_departed`` (expired or rejected, as many as the ledger counts) or still in ``waiting_payloads``."""
    s = make_sampler(SamplerConfig(method, 3, pool_factor=2, cap=1, max_staleness=1, max_pending=2,
                                   max_pending_age=1), track_departed=True)
    sent, selected, departed = [], [], []
    for step in range(8):
        arrivals = [turn(f"r{(step + i) % 4}", 10 * step + i, version=max(0, step - i % 3), score=i % 3,
                         defect="missing_teacher" if i == 2 else None) for i in range(5)]
        s.add(arrivals)
        sent += [t.key for t in arrivals]
        batch = s.next_batch(step)
        selected += [] if batch is None else [t.key for t in batch.payloads]
        departed += [t.key for t in s.take_departed()]
    waiting = [t.key for t in s.waiting_payloads()]
    assert sorted(selected + departed + waiting) == sorted(sent)
    assert len(departed) == s.ledger.expired + s.ledger.invalid > 0 and len(waiting) == s.waiting


def test_take_departed_needs_a_tracking_sampler() -> None:
    with pytest.raises(RuntimeError, match="track_departed"):
        make_sampler(SamplerConfig("divopd", 2)).take_departed()
