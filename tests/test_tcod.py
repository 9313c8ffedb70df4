"""TCOD-F2B horizon schedule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from divopd.tcod import TCODConfig, tcod_horizon, tcod_progress


def test_linear_schedule_exact_values():
    # start 2, full 10, reached at half of training: ramp f = p / 0.5, horizon = 2 + floor(8 f)
    got = [tcod_horizon(p, 2, 10, 0.5) for p in (0.0, 0.05, 0.0625, 0.125, 0.25, 0.4375, 0.49, 0.5, 0.75, 1.0)]
    assert got == [2, 2, 3, 4, 6, 9, 9, 10, 10, 10]


def test_stages_schedule_jumps_in_equal_steps():
    got = [tcod_horizon(p, 2, 10, 1.0, schedule="stages", num_stages=4) for p in (0, 0.24, 0.25, 0.5, 0.74, 0.75, 1)]
    assert got == [2, 2, 4, 6, 6, 8, 10]
    assert tcod_horizon(0.99, 1, 30, 1.0, schedule="stages", num_stages=1) == 1  # one jump, at the end
    assert tcod_horizon(1.0, 1, 30, 1.0, schedule="stages", num_stages=1) == 30


def test_float_noise_does_not_cost_a_turn():
    # 0.01 / 0.05 * 5 is 0.9999999999999999 in floats; the exact ramp value is 1
    assert tcod_horizon(0.01, 1, 6, 0.05) == 2
    assert tcod_horizon(0.01, 2, 22, 0.05) == 6


def test_start_depth_above_the_step_limit_is_clipped():
    assert tcod_horizon(0.0, 50, 10, 0.5) == 10
    assert tcod_horizon(0.3, 50, 10, 0.5) == 10


@settings(max_examples=200, deadline=None)
@given(
    p1=st.floats(0, 2, allow_nan=False),
    p2=st.floats(0, 2, allow_nan=False),
    start=st.integers(1, 60),
    full=st.integers(1, 60),
    frac=st.floats(0.01, 1.0),
    schedule=st.sampled_from(["linear", "stages"]),
    stages=st.integers(1, 10),
)
def test_horizon_is_bounded_monotone_and_reaches_the_limit(p1, p2, start, full, frac, schedule, stages):
    lo, hi = sorted((p1, p2))
    h_lo = tcod_horizon(lo, start, full, frac, schedule, stages)
    h_hi = tcod_horizon(hi, start, full, frac, schedule, stages)
    assert isinstance(h_lo, int)
    assert min(start, full) <= h_lo <= h_hi <= full
    assert tcod_horizon(0.0, start, full, frac, schedule, stages) == min(start, full)
    assert tcod_horizon(frac, start, full, frac, schedule, stages) == full


def test_config_by_update_and_defaults():
    cfg = TCODConfig(enabled=True, start_depth=3, expand_fraction=0.5, total_updates=200)
    assert [cfg.horizon(30, update=u) for u in (0, 50, 100, 150, 400)] == [3, 16, 30, 30, 30]
    assert cfg.horizon(30, progress=0.25) == 16
    assert cfg.sampler_method == "vanilla"
    off = TCODConfig()
    assert off.enabled is False and off.horizon(30, update=0) == 30  # curriculum off: full limit
    assert tcod_progress(50, 200) == 0.25 and tcod_progress(500, 200) == 1.0


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="progress"):
        tcod_horizon(-0.1, 2, 10, 0.5)
    with pytest.raises(ValueError, match="start_depth"):
        tcod_horizon(0.1, 0, 10, 0.5)
    with pytest.raises(ValueError, match="max_steps"):
        tcod_horizon(0.1, 2, 0, 0.5)
    with pytest.raises(ValueError, match="expand_fraction"):
        tcod_horizon(0.1, 2, 10, 0.0)
    with pytest.raises(ValueError, match="schedule"):
        tcod_horizon(0.1, 2, 10, 0.5, schedule="exp")
    with pytest.raises(ValueError, match="total_updates"):
        TCODConfig(enabled=True).horizon(10, update=3)
    with pytest.raises(ValueError, match="exactly one"):
        TCODConfig(enabled=True, total_updates=10).horizon(10)
    with pytest.raises(ValidationError):
        TCODConfig(sampler_method="divopd")
    with pytest.raises(ValidationError):
        TCODConfig(expand_fraction=1.5)
    with pytest.raises(ValidationError):
        TCODConfig(start_dept=3)  # typo: unknown keys are refused
