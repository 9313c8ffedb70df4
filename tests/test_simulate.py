"""divopd simulate: determinism, the producer rules, preset dead-row ranges and the paper's coverage direction."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from divopd.analysis.replay import ReplayConfig, replay
from divopd.analysis.simulate import PRESETS, expected_horizon, policy_version, prompt_lengths, simulate
from divopd.cli import main
from divopd.experience.log import read_log, validate_schema

UPDATES = 30


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """One short simulated log per preset (default load ≈ 2 at B = 256)."""
    d = tmp_path_factory.mktemp("sim")
    out = {}
    for name in PRESETS:
        path = d / f"{name}.parquet"
        summary = simulate(name, path, updates=UPDATES, seed=1)
        out[name] = (path, summary, pq.read_table(path))
    return out


@pytest.fixture(scope="module")
def replays(logs):
    cfg = ReplayConfig(methods=["vanilla", "divopd-base", "divopd"], batch_size=256, updates=UPDATES)
    return {name: replay(path, cfg) for name, (path, _, _) in logs.items()}


def test_same_seed_same_log_other_seed_other_log(tmp_path):
    a = simulate("webshop", tmp_path / "a.parquet", updates=5, seed=3)
    b = simulate("webshop", tmp_path / "b.parquet", updates=5, seed=3)
    c = simulate("webshop", tmp_path / "c.parquet", updates=5, seed=4)
    fa, fb, fc = ((tmp_path / f"{x}.parquet").read_bytes() for x in "abc")
    assert a == b and fa == fb
    assert fa != fc and a != c


def test_log_is_valid_and_follows_the_producer_rules(logs):
    for name, (path, summary, table) in logs.items():
        preset = PRESETS[name]
        validate_schema(table.schema)
        assert table.num_rows == summary.turns > 0
        assert list(read_log(path))[-1].arrival == summary.turns - 1
        cols = {k: table.column(k).to_numpy(zero_copy_only=False) for k in table.column_names}
        assert (cols["policy_version"] <= cols["arrival_update"]).all()
        assert (cols["arrival_update"] < UPDATES).all()
        assert (cols["env"] == name).all() and not cols["teacher_acted"].any()
        # a rollout's turns arrive together (consecutive arrivals, one arrival_update), in turn order
        rids = cols["rollout_id"]
        starts = np.flatnonzero(np.r_[True, rids[1:] != rids[:-1]])
        assert len(starts) == len(set(rids)) == summary.rollouts
        bounds = np.r_[starts, len(rids)]
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            assert (cols["turn_index"][s:e] == np.arange(e - s)).all()
            assert len(set(cols["arrival_update"][s:e])) == 1 and len(set(cols["policy_version"][s:e])) == 1
            # outcome-dependent horizon: failures run to the step limit, successes end earlier
            if cols["success"][s]:
                assert preset.min_horizon <= e - s < preset.step_limit
            else:
                assert e - s == preset.step_limit
            # truncation only once the history passes the budget: late turns, never before a kept prompt
            trunc = cols["prompt_truncated"][s:e]
            if trunc.any():
                first = int(np.argmax(trunc))
                assert trunc[first:].all()
                assert (cols["prompt_len"][s:e][trunc] == preset.context_budget).all()
        # truncated turns carry no teacher-scored token; others are fully scored
        teacher = table.column("teacher_logprobs").to_pylist()
        for i in np.flatnonzero(cols["prompt_truncated"])[:50]:
            assert all(math.isnan(x) for x in teacher[i])
        assert summary.truncated_turns == int(cols["prompt_truncated"].sum())


def test_explorer_delay_gives_version_lag():
    assert policy_version(5.7, 0) == 5 and policy_version(5.7, 1) == 4 and policy_version(0.3, 1) == 0


def test_prompt_lengths_rule():
    preset = PRESETS["alfworld"]
    obs = np.array([10, 10, 10, 10])
    resp = np.array([1000, 1000, 1000, 1000])
    lens, trunc = prompt_lengths(preset, obs, resp)
    # 350 + history + obs: 360, 1370, 2380, 3390 -> all within 4096
    assert lens.tolist() == [360, 1370, 2380, 3390] and not trunc.any()
    lens, trunc = prompt_lengths(preset, np.array([10] * 6), np.array([1000] * 6))
    assert trunc.tolist() == [False] * 4 + [True] * 2 and lens[-1] == preset.context_budget
    window = PRESETS["scienceworld"]
    _, trunc = prompt_lengths(window, np.full(200, 500), np.full(200, 512))
    assert trunc.any()  # the window does not make truncation impossible, only rare at realistic lengths


def test_dead_rows_under_vanilla_match_the_presets(replays):
    """ALFWorld/WebShop-like presets give 5–28% dead rows under vanilla, ScienceWorld-like none (paper, Section 2)."""
    for name in ("alfworld", "webshop"):
        assert 0.05 <= replays[name]["methods"]["vanilla"]["dead_row_fraction"] <= 0.28, name
    assert replays["scienceworld"]["methods"]["vanilla"]["dead_row_fraction"] == 0.0
    for r in replays.values():
        for m in ("divopd-base", "divopd"):
            assert r["methods"][m]["dead_row_fraction"] == 0.0  # the gate removes them


def test_load_above_one_reproduces_the_papers_direction(replays, logs):
    """Rollout-first uses far more of the valid rollouts and has several times more effective rollouts per batch."""
    for name, r in replays.items():
        assert logs[name][1].arrival_drain_ratio > 1.5
        assert r["arrival_drain_ratio"] == pytest.approx(logs[name][1].arrival_drain_ratio)
        v, base, div = (r["methods"][m] for m in ("vanilla", "divopd-base", "divopd"))
        assert v["unused_fraction"] > 0.3, name
        for m in (base, div):
            assert m["unused_fraction"] < v["unused_fraction"] / 3, name
            assert m["used_rollouts"] > 1.4 * v["used_rollouts"], name
            assert m["effective_rollouts_mean"] > 2.5 * v["effective_rollouts_mean"], name
        # DivOPD-base and DivOPD allocate rollouts identically: the same rollouts are reached
        assert base["used_rollouts"] == div["used_rollouts"]


def test_rollouts_per_update_sets_the_load(tmp_path):
    light = simulate("webshop", tmp_path / "light.parquet", updates=20, rollouts_per_update=12, seed=0)
    heavy = simulate("webshop", tmp_path / "heavy.parquet", updates=20, rollouts_per_update=36, seed=0)
    assert light.arrival_drain_ratio < 1 < heavy.arrival_drain_ratio
    assert heavy.turns_per_update / light.turns_per_update == pytest.approx(3, rel=0.2)


def test_pacing_matches_the_requested_rollout_rate(logs):
    for name, (_, summary, _) in logs.items():
        rate = summary.rollouts / UPDATES
        assert 0.75 * PRESETS[name].default_rollouts_per_update < rate < 1.1 * PRESETS[name].default_rollouts_per_update
        assert summary.mean_horizon == pytest.approx(expected_horizon(PRESETS[name]), rel=0.15)


def test_cli_prints_the_measured_ratio_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    args = ["simulate", "--preset", "webshop", "--updates", "5", "--out", str(out), "--batch-size", "128"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "arrival/drain ratio" in text and "B=128" in text
    assert main(args) == 2
    assert "exists" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    assert main([*args[:-2], "--force", "--success-rate", "2"]) == 2
