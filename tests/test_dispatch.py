"""The producer matched to the composer (divopd.integrations.dispatch): sessions per step from the running mean of
turns per session, so that about ρ*·B turns arrive per trained batch of B; in-flight cover in asynchronous mode;
``rollout.n`` sessions per prompt; the starved and out-of-band warnings."""

from __future__ import annotations

import random

import pytest

from divopd.errors import UsageError
from divopd.integrations.dispatch import (
    ArrivalDispatch,
    check_target,
    sessions_per_step,
    start_turns_per_session,
)


def play(rule: ArrivalDispatch, steps: int, lengths: random.Random, horizon: int, lag: int = 0,
         low: float = 0.25) -> list[dict[str, float]]:
    """A producer whose sessions last U[low·H, H] turns and come back ``lag`` steps after their start."""
    out_by_step: dict[int, list[int]] = {}
    metrics = []
    for step in range(steps):
        n = rule.prompts_to_submit() * rule.sessions_per_prompt
        rule.started(n)
        out_by_step.setdefault(step + lag, []).extend(
            lengths.randint(max(1, int(low * horizon)), horizon) for _ in range(n))
        rids = [f"{step}-{i}" for i, turns in enumerate(out_by_step.pop(step, [])) for _ in range(turns)]
        rule.observe(rids)
        metrics.append(rule.step_metrics(expired=0))
    return metrics


def test_the_start_value_is_half_the_horizon_and_sets_the_first_sessions() -> None:
    rule = ArrivalDispatch(batch_size=64, horizon=30, target=2.0)
    assert start_turns_per_session(30) == 15 and rule.turns_per_session == 15
    assert sessions_per_step(2.0, 64, 15) == 9  # ceil(128 / 15): the static line
    assert rule.sessions_to_start() == 8  # 128 / 15 = 8.53: 8 now, the 0.53 owed to the next step
    rule.started(8)
    rule.observe([f"r{i}" for i in range(8) for _ in range(15)])  # all 8 back, 15 turns each
    rule.step_metrics(expired=0)
    assert rule.sessions_to_start() == 9  # 8.53 + 0.53


def test_the_running_mean_of_turns_per_session_sets_the_next_sessions() -> None:
    rule = ArrivalDispatch(batch_size=64, horizon=30)
    rule.observe(["a"] * 8 + ["b"] * 12)  # two sessions, 10 turns on average
    assert rule.turns_per_session == 10
    assert rule.sessions_to_start() == 12  # 128 / 10
    rule.observe(["b"] * 4)  # more turns of a session already seen: the same session, not a new one
    assert rule.finished_sessions == 2 and rule.turns_per_session == 12


@pytest.mark.parametrize("horizon", [15, 30])
def test_a_synchronous_producer_arrives_at_the_target_ratio(horizon: int) -> None:
    rule = ArrivalDispatch(batch_size=32, horizon=horizon, target=2.0)
    metrics = play(rule, 60, random.Random(0), horizon)
    ratios = [m["sampler/arrival_ratio"] for m in metrics[4:]]
    assert 1.8 <= sum(ratios) / len(ratios) <= 2.2
    windows = [sum(ratios[i:i + 5]) / 5 for i in range(len(ratios) - 4)]  # a few sessions a step: noisy steps
    assert all(1.5 <= w <= 2.5 for w in windows), windows
    assert all(m["sampler/sessions_started"] >= 1 for m in metrics)


def test_asynchronous_mode_keeps_enough_sessions_in_flight_to_cover_the_lag() -> None:
    rule = ArrivalDispatch(batch_size=32, horizon=20, target=2.0, asynchronous=True)
    metrics = play(rule, 80, random.Random(1), 20, lag=2)
    ratios = [m["sampler/arrival_ratio"] for m in metrics[10:]]
    assert 1.7 <= sum(ratios) / len(ratios) <= 2.3
    assert rule.lag == pytest.approx(2.0)


def test_rollout_n_sessions_per_prompt_divide_the_prompts() -> None:
    rule = ArrivalDispatch(batch_size=64, horizon=30, sessions_per_prompt=4)
    assert rule.prompts_to_submit() == 2  # 8 sessions -> 2 prompts of 4
    metrics = play(rule, 40, random.Random(2), 30)
    ratios = [m["sampler/arrival_ratio"] for m in metrics[4:]]
    assert 1.8 <= sum(ratios) / len(ratios) <= 2.2  # whole prompts of 4: the surplus is owed back


def test_today_s_dispatch_of_b_sessions_per_step_arrives_at_many_times_b() -> None:
    """verl's own dispatch (B prompts a step) against the same producer: the ratio the matched rule replaces."""
    lengths = random.Random(0)
    arrived = sum(lengths.randint(7, 30) for _ in range(64))
    assert arrived / 64 > 7


def test_the_expired_share_is_expired_over_arrived() -> None:
    rule = ArrivalDispatch(batch_size=4, horizon=10)
    rule.observe(["a"] * 8)
    m = rule.step_metrics(expired=2)
    assert m["sampler/arrival_ratio"] == 2 and m["sampler/expired_share"] == 0.25
    assert rule.step_metrics(expired=0)["sampler/expired_share"] == 0.0  # nothing arrived


def test_a_starved_step_warns_in_one_line_and_not_every_step() -> None:
    rule = ArrivalDispatch(batch_size=64, horizon=30)
    rule.observe(["a"] * 64)
    rule.step_metrics(expired=0)
    assert rule.warnings("w") == []
    warned = []
    for _ in range(10):
        rule.observe(["b"] * 10)
        rule.step_metrics(expired=0)
        warned += rule.warnings("w")
    assert len(warned) == 1 and "starved" in warned[0] and "\n" not in warned[0]


def test_out_of_band_ratio_names_the_config_line_and_the_value_once() -> None:
    rule = ArrivalDispatch(batch_size=64, horizon=30, config_hint="buffer.batch_size: {value}")
    warned = []
    for step in range(8):  # 16 tasks x 30 turns a step: 7.5 x B
        rule.observe([f"{step}-{i}" for i in range(16) for _ in range(30)])
        rule.step_metrics(expired=0)
        warned += rule.warnings("trinity")
    assert len(warned) == 1, warned
    assert "buffer.batch_size: 5" in warned[0]  # ceil(2 * 64 / 30)
    inside = ArrivalDispatch(batch_size=64, horizon=30, config_hint="buffer.batch_size: {value}")
    for step in range(8):
        inside.observe([f"{step}-{i}" for i in range(5) for _ in range(26)])
        inside.step_metrics(expired=0)
        assert inside.warnings("trinity") == []


@pytest.mark.parametrize("bad", [0.5, "x", float("nan"), None])
def test_a_bad_target_is_one_line(bad: object) -> None:
    with pytest.raises(UsageError, match="target_arrival_ratio"):
        check_target(bad, "sampler_kwargs")
    assert check_target("1.5", "x") == 1.5
