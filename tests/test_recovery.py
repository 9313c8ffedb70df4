"""+R: the trigger rule, the takeover state machine, and the explorer handing control to the teacher and back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divopd.explorer import Explorer, ExplorerConfig
from divopd.recovery import RecoveryConfig, RecoveryState, should_recover
from explorer_helpers import env_tokenizer, tiny_model


def test_should_recover_needs_enabled_warmup_and_patience():
    cfg = RecoveryConfig(enabled=True, patience=3, max_takeover=2, warmup=5)
    assert should_recover(3, 5, cfg)
    assert should_recover(7, 9, cfg)
    assert not should_recover(2, 5, cfg)  # not patient enough yet
    assert not should_recover(3, 4, cfg)  # learner still in warmup
    assert not should_recover(3, 5, cfg.model_copy(update={"enabled": False}))


def drive(progress_of_student: list[bool], cfg: RecoveryConfig, learner_version: int = 0) -> list[str]:
    """Actors chosen turn by turn, the student's steps taking the given progress flags, the teacher's none."""
    state, actors, it = RecoveryState(), [], iter(progress_of_student)
    while True:
        actor = state.next_actor(learner_version, cfg)
        if actor == "student":
            progress = next(it, None)
            if progress is None:
                return actors
        else:
            progress = False
        actors.append(actor)
        state.record(actor, progress, cfg)


def test_teacher_takes_over_after_p_no_progress_turns_for_m_turns():
    cfg = RecoveryConfig(enabled=True, patience=2, max_takeover=3)
    actors = drive([False, False, False, True, False, False], cfg)
    assert actors == ["student", "student", "teacher", "teacher", "teacher",
                      "student", "student", "student", "student", "teacher", "teacher", "teacher"]


def test_progress_resets_the_streak_and_evaluation_never_recovers():
    cfg = RecoveryConfig(enabled=True, patience=2, max_takeover=1)
    assert drive([False, True, False, True, False], cfg) == ["student"] * 5
    state = RecoveryState(no_progress_streak=10)
    assert state.next_actor(0, cfg, evaluating=True) == "student"


def test_return_on_progress_ends_the_takeover_early():
    cfg = RecoveryConfig(enabled=True, patience=1, max_takeover=5, return_on_progress=True)
    state = RecoveryState()
    state.record("student", False, cfg)
    assert state.next_actor(0, cfg) == "teacher"
    state.record("teacher", False, cfg)
    assert state.next_actor(0, cfg) == "teacher"
    state.record("teacher", True, cfg)
    assert state.next_actor(0, cfg) == "student" and state.teacher_turns == 2 and state.takeovers == 1


@settings(max_examples=60, deadline=None)
@given(flags=st.lists(st.booleans(), max_size=40), p=st.integers(1, 4), m=st.integers(1, 4))
def test_takeovers_start_only_after_p_no_progress_and_last_m(flags, p, m):
    cfg = RecoveryConfig(enabled=True, patience=p, max_takeover=m)
    actors = drive(flags, cfg)
    streak, run, student_i = 0, 0, 0
    for j, actor in enumerate(actors):
        if actor == "teacher":
            if run == 0:
                assert streak >= p and actors[j - 1] == "student"
            run += 1
            assert run <= m
        else:
            if run:
                assert run == m  # never shorter unless the episode ended (not here)
                streak, run = 0, 0
            streak = 0 if flags[student_i] else streak + 1
            student_i += 1
            assert streak <= p


# ---------------------------------------------------------------------------- through the explorer
def check_rollout_follows_plus_r(rollout, p: int, m: int, max_steps: int) -> int:
    """Replay the +R rule on a rollout: student turn indices leave a gap of exactly m (teacher turns) right after
    each p-th consecutive no-progress student turn, and nowhere else; returns the number of teacher turns seen."""
    turns = rollout.turns
    streak, teacher_seen, expected_next = 0, 0, 0
    for t in turns:
        gap = t.turn_index - expected_next
        if streak >= p:
            assert gap == m, (rollout.info, [u.turn_index for u in turns])
            streak = 0
        else:
            assert gap == 0, (rollout.info, [u.turn_index for u in turns])
        teacher_seen += gap
        streak = 0 if t.info["progress"] else streak + 1
        expected_next = t.turn_index + 1
    tail = rollout.info["horizon"] - expected_next  # teacher turns after the last student turn
    assert 0 <= tail <= m and (tail == 0 or streak >= p)
    teacher_seen += tail
    assert teacher_seen == rollout.info["teacher_turns"]
    assert rollout.info["horizon"] <= max_steps
    return teacher_seen


@pytest.mark.parametrize("env_name", ["tiny", "twx"])
def test_explorer_hands_control_to_the_teacher_and_back(env_name):
    tok = env_tokenizer(env_name)
    p, m, max_steps = 2, 2, 10
    cfg = ExplorerConfig(env=env_name, num_envs=3, max_steps=max_steps,
                         generation={"max_new_tokens": 4},
                         recovery={"enabled": True, "patience": p, "max_takeover": m})
    with Explorer(cfg, tiny_model(tok, 0), tok, tiny_model(tok, 1), seed=0) as explorer:
        rollouts = explorer.collect(6)
        teacher_turns = sum(check_rollout_follows_plus_r(r, p, m, max_steps) for r in rollouts)
        assert teacher_turns > 0  # a random student makes no progress often enough to trigger +R
        assert explorer.stats()["explorer/teacher_turns"] == teacher_turns
        # teacher turns are never queued: every Turn is a student turn
        assert all(t.info["teacher_acted"] is False for r in rollouts for t in r.turns)
        before = explorer.stats()["explorer/teacher_turns"]
        explorer.evaluate(num_tasks=3)  # recovery is off during evaluation
        assert explorer.stats()["explorer/teacher_turns"] == before


def test_explorer_recovery_waits_for_the_learner_warmup():
    tok = env_tokenizer("tiny")
    cfg = ExplorerConfig(env="tiny", num_envs=2, max_steps=8, generation={"max_new_tokens": 4},
                         recovery={"enabled": True, "patience": 1, "max_takeover": 1, "warmup": 3})
    with Explorer(cfg, tiny_model(tok, 0), tok, tiny_model(tok, 1), seed=0) as explorer:
        assert all(r.info["teacher_turns"] == 0 for r in explorer.collect(3))
        explorer.set_learner_version(3)
        later = explorer.collect(6)
        assert sum(r.info["teacher_turns"] for r in later) > 0
    with pytest.raises(ValueError, match="needs a teacher"):
        Explorer(cfg, tiny_model(tok, 0), tok, None)
