"""TCOD-F2B: TCOD's depth rule d = 1 + floor(step / eta), the cut rollout, full-horizon evaluation, the configs' eta;
then the earlier (non-default) linear / stages schedules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from divopd.explore.tcod import TCODConfig, tcod_depth, tcod_horizon, tcod_progress


# ---------------------------------------------------------------------------- TCOD's rule
def test_depth_sequence_for_eta_6_and_4():
    assert [tcod_depth(s, 6) for s in range(1, 20)] == [1] * 5 + [2] * 6 + [3] * 6 + [4] * 2
    assert [tcod_depth(s, 4) for s in range(1, 14)] == [1] * 3 + [2] * 4 + [3] * 4 + [4] * 2
    assert tcod_depth(0, 6) == 1 and tcod_depth(250, 6) == 42 and tcod_depth(150, 4) == 38
    with pytest.raises(ValueError, match="eta"):
        tcod_depth(3, 0)
    with pytest.raises(ValueError, match="step"):
        tcod_depth(-1, 6)


def test_paper_schedule_counts_learner_updates_plus_one_and_caps_at_the_step_limit():
    cfg = TCODConfig(enabled=True, eta=6)
    assert cfg.schedule == "paper"
    # update v collects rollouts for training step v + 1 (TCOD's 1-based batch_id)
    assert [cfg.horizon(30, update=v) for v in range(0, 13)] == [1] * 5 + [2] * 6 + [3] * 2
    assert cfg.horizon(30, update=200) == 30 and cfg.horizon(15, update=10**6) == 15
    webshop = TCODConfig(enabled=True, eta=4)
    assert [webshop.horizon(15, update=v) for v in (0, 2, 3, 7, 55, 56)] == [1, 1, 2, 3, 15, 15]
    assert TCODConfig(eta=4).horizon(15, update=0) == 15  # curriculum off: the full limit
    with pytest.raises(ValueError, match="update="):
        cfg.horizon(30, progress=0.5)


@pytest.mark.parametrize("env_name, eta", [("alfworld", 6), ("scienceworld", 6), ("webshop", 4)])
def test_configs_set_eta_per_environment(env_name, eta):
    from divopd.train.config import load_config

    cfg = load_config(env_name, ["method=tcod-f2b"])
    assert cfg.tcod.enabled and cfg.tcod.schedule == "paper" and cfg.tcod.eta == eta
    assert cfg.sampler_config().method == "vanilla"


def test_the_rollout_is_cut_at_d_every_student_turn_is_kept_and_evaluation_is_full_horizon():
    from divopd.explore.explorer import Explorer, ExplorerConfig
    from divopd.train.config import load_config
    from divopd.train.runtime.common import step_limit
    from explorer_helpers import env_tokenizer, tiny_model

    cfg = load_config("tiny", ["method=tcod-f2b", "explorer.max_steps=9"])
    assert [step_limit(cfg, v) for v in (0, 5, 11, 17, 100)] == [1, 2, 3, 4, 9]
    tok = env_tokenizer("tiny")
    ecfg = ExplorerConfig(env="tiny", num_envs=2, max_steps=9, generation={"max_new_tokens": 4})
    # the step limit is given at construction (as the runtimes build their explorers); at learner version 11: d = 3
    with Explorer(ecfg, tiny_model(tok, 0), tok, tiny_model(tok, 1), seed=0, policy_version=11,
                  step_limit=lambda weights: step_limit(cfg, weights)) as explorer:
        assert explorer.max_steps == 3 and explorer.config.max_steps == 9
        rollouts = explorer.collect(6)
        for r in rollouts:
            assert r.info.horizon <= 3 and r.info.student_turns == r.info.horizon == len(r.turns)
            assert [t.turn_index for t in r.turns] == list(range(r.info.horizon))
            assert all(t.teacher_logprobs is not None for t in r.turns)  # every student turn is scored
        assert any(r.info.hit_step_limit for r in rollouts)  # a random student is cut at d
    # the evaluator is built from the config: the full explorer.max_steps, whatever the curriculum's depth
    evaluator_cfg = cfg.explorer.model_copy(deep=True)
    assert evaluator_cfg.max_steps == 9
    with Explorer(evaluator_cfg, tiny_model(tok, 0), tok, None, seed=0) as evaluator:
        result = evaluator.evaluate(num_tasks=4)
    assert result["eval/mean_steps"] > 3  # episodes run past d = 3 (a random student rarely wins)


# ---------------------------------------------------------------------------- the earlier, non-default schedules


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
    cfg = TCODConfig(enabled=True, schedule="linear", start_depth=3, expand_fraction=0.5, total_updates=200)
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
        TCODConfig(enabled=True, schedule="linear").horizon(10, update=3)
    with pytest.raises(ValueError, match="exactly one"):
        TCODConfig(enabled=True, schedule="linear", total_updates=10).horizon(10)
    with pytest.raises(ValidationError):
        TCODConfig(sampler_method="divopd")
    with pytest.raises(ValidationError):
        TCODConfig(expand_fraction=1.5)
    with pytest.raises(ValidationError):
        TCODConfig(start_dept=3)  # typo: unknown keys are refused
