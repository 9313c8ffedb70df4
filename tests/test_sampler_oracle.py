"""The sampler selects, update by update, exactly what the list-and-selector sampler it replaced selects
(``tests/sampler_oracle``): every method row, over seeded random arrival streams with ties, defects, stale turns,
both cap units, W and max_pending set and unset."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

import sampler_oracle.rows  # noqa: F401 — fills the oracle's method table
from divopd.sampling import METHODS, SamplerConfig, make_sampler
from sampler_helpers import turn
from sampler_oracle.sampler import SamplerConfig as OracleConfig
from sampler_oracle.sampler import make_sampler as oracle_sampler

STREAMS = 210
DEFECTS = (None,) * 12 + ("prompt_truncated", "missing_teacher", "length_mismatch", "no_valid_token", "nan_teacher",
                          "empty_response", "missing_student_logprobs")


def stream(rng: np.random.Generator, updates: int) -> list[list]:
    """Per update, the turns that arrive before it (a burst first, so that turns wait in the pool): few rollouts (so
    groups and ties are common), integer scores (ties), varying lengths and versions, about one in seven with a
    defect, some with a task."""
    out, version = [], 0
    for step in range(updates):
        version = max(version, step - int(rng.integers(0, 4)))
        arrivals = []
        for _ in range(24 if step == 0 else int(rng.integers(0, 8))):
            rid = f"r{int(rng.integers(0, 6))}"
            info = {"task": f"t{int(rng.integers(0, 3))}"} if rng.random() < 0.5 else {}
            arrivals.append(turn(rid, int(rng.integers(0, 6)), version=int(rng.integers(max(0, version - 3),
                                                                                             version + 1)),
                                 n=int(rng.integers(1, 9)), score=float(rng.integers(-2, 3)),
                                 defect=DEFECTS[int(rng.integers(0, len(DEFECTS)))], info=info))
        out.append(arrivals)
    return out


def settings(rng: np.random.Generator) -> dict:
    return {
        "batch_size": int(rng.integers(1, 6)),
        "pool_factor": float(rng.choice([1, 1.5, 2, 4])),
        "cap": int(rng.integers(1, 4)),
        "max_staleness": int(rng.integers(0, 3)),
        "max_pending": None if rng.random() < 0.5 else int(rng.integers(0, 8)),
        "max_pending_age": None if rng.random() < 0.5 else int(rng.integers(0, 4)),
        "cap_unit": str(rng.choice(["turns", "tokens"])),
        "group_order": "first-seen",
        "seed": int(rng.integers(0, 1000)),
    }


@pytest.mark.parametrize("seed", range(STREAMS))
def test_every_rule_selects_what_the_old_sampler_selects(seed: int) -> None:
    rng = np.random.default_rng(seed)
    kw = settings(rng)
    arrivals = stream(rng, 14)
    for method in METHODS:
        new, old = make_sampler(SamplerConfig(method, **kw)), oracle_sampler(OracleConfig(method, **kw))
        for update, turns in enumerate(arrivals):
            assert new.add(turns) == old.add(turns)
            a, b = new.next_batch(update), old.next_batch(update)
            where = f"{method} {kw} update {update}"
            assert (a is None) == (b is None), where
            if a is not None:
                assert a.arrivals == b.arrivals, where
                assert a.stats == b.stats, where
                assert a.row_weights == b.row_weights, where
                assert a.first_seen == b.first_seen and [t.key for t in a.candidates] == [t.key for t in b.candidates]
            assert asdict(new.ledger) == old.ledger, where
