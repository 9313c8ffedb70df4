"""+R (Appendix G): the no-progress rule, the trigger, the per-rollout cap, warmup and evaluation, on hand-worked
episodes; then the explorer handing control to the teacher and back on a scripted TinyEnv episode."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divopd.explore.envs.tiny import TinyEnv
from divopd.explore.explorer import Explorer, ExplorerConfig
from divopd.explore.recovery import RecoveryConfig, RecoveryState, is_no_progress, should_recover
from divopd.learn.checkpoint import WeightHandle
from explorer_helpers import env_tokenizer, tiny_model

A = frozenset({"look around", "open door"})
B = frozenset({"look around", "open door", "go through door"})


def test_should_recover_is_the_papers_trigger():
    cfg = RecoveryConfig(enabled=True, patience=3, max_takeover=2, warmup=5)
    assert should_recover(3, 5, cfg)
    assert should_recover(7, 9, cfg)
    assert not should_recover(2, 5, cfg)  # fewer than p consecutive no-progress turns
    assert not should_recover(3, 4, cfg)  # the learner is still in its warmup
    assert not should_recover(3, 5, cfg, teacher_turns=2)  # the rollout's m teacher turns are spent
    assert not should_recover(3, 5, cfg.model_copy(update={"enabled": False}))


# ---------------------------------------------------------------------------- the no-progress rule
def test_a_repeated_action_with_unchanged_allowed_actions_is_no_progress():
    state = RecoveryState()
    state.start(A)
    assert state.step("student", "open door", False, A, "The door is locked.", RecoveryConfig()) is False  # first
    assert state.step("student", "open door", False, A, "The door is locked.", RecoveryConfig()) is True
    assert state.step("student", "Open  Door ", False, A, "The door is locked.", RecoveryConfig()) is True  # same
    assert state.no_progress_streak == 2


def test_a_repeated_action_with_changed_allowed_actions_is_progress():
    cfg = RecoveryConfig()
    state = RecoveryState()
    state.start(A)
    assert state.step("student", "open door", False, B, "The door opens.", cfg) is False
    # repeated, but the allowed set when it is taken (B) is not the one of the previous "open door" (A)
    assert state.step("student", "open door", False, B, "It is already open.", cfg) is False
    # now both were taken with B: a repeat with unchanged allowed actions
    assert state.step("student", "open door", False, B, "It is already open.", cfg) is True
    assert [np for _, np in state.log] == [False, False, True]


def test_an_invalid_action_is_no_progress_even_first_and_a_new_action_is_progress():
    cfg = RecoveryConfig()
    state = RecoveryState()
    state.start(A)
    assert state.step("student", "fly to the moon", True, A, "I'm not sure what you mean.", cfg) is True
    assert state.step("student", "look around", False, A, "A room.", cfg) is False  # valid, not a repeat
    assert state.no_progress_streak == 0
    assert is_no_progress("x", True, A, None, None) and not is_no_progress("x", False, A, None, None)


def test_without_allowed_actions_the_observation_stands_for_them():
    cfg = RecoveryConfig()
    state = RecoveryState()
    state.start(None, "Room A.")
    assert state.step("student", "wait", False, None, "Room A.", cfg) is False
    assert state.step("student", "wait", False, None, "Room B.", cfg) is True  # taken in "Room A." both times
    assert state.step("student", "wait", False, None, "Room B.", cfg) is False  # taken in B, previous one in A


# ---------------------------------------------------------------------------- takeovers
def drive(no_progress: list[bool], cfg: RecoveryConfig, teacher_no_progress: bool = False,
          learner_version: int = 0) -> list[str]:
    """Actors turn by turn: student steps take the given no-progress flags, teacher steps ``teacher_no_progress``."""
    state, actors, it = RecoveryState(), [], iter(no_progress)
    while True:
        actor = state.next_actor(learner_version, cfg)
        if actor == "student":
            flag = next(it, None)
            if flag is None:
                return actors
        else:
            flag = teacher_no_progress
        actors.append(actor)
        state.record(actor, flag, cfg)


S, T = "student", "teacher"


def test_p_consecutive_no_progress_turns_start_a_takeover_that_spends_the_rollouts_m():
    cfg = RecoveryConfig(enabled=True, patience=2, max_takeover=3)
    # a progress turn breaks the count; 2 in a row start the takeover; the teacher acts m = 3 turns, the student
    # resumes, and the rollout has no teacher turns left: no second takeover however long it stalls
    actors = drive([False, True, False, True, True, True, True, True, True], cfg)  # flags: no progress
    assert actors == [S, S, S, S, S, T, T, T, S, S, S, S]


def test_the_cap_m_is_per_rollout_across_two_takeovers():
    cfg = RecoveryConfig(enabled=True, patience=1, max_takeover=3, return_on_progress=True)
    state = RecoveryState()
    state.record(S, True, cfg)
    assert state.next_actor(0, cfg) == T  # takeover 1
    state.record(T, True, cfg)  # a no-progress teacher turn: the teacher keeps control
    assert state.next_actor(0, cfg) == T
    state.record(T, False, cfg)  # a teacher turn that makes progress: control returns
    assert state.next_actor(0, cfg) == S and state.teacher_turns == 2
    state.record(S, True, cfg)
    assert state.next_actor(0, cfg) == T  # takeover 2, with 1 of the rollout's 3 teacher turns left
    state.record(T, True, cfg)
    assert state.next_actor(0, cfg) == S  # the cap ends it, although that turn made no progress
    for _ in range(5):
        state.record(S, True, cfg)
        assert state.next_actor(0, cfg) == S  # cap spent: the student keeps control for the rest of the rollout
    assert (state.teacher_turns, state.takeovers) == (3, 2)


def test_warmup_is_counted_in_learner_updates_and_evaluation_never_recovers():
    cfg = RecoveryConfig(enabled=True, patience=1, max_takeover=2, warmup=45)
    assert drive([True] * 4, cfg, learner_version=44) == [S] * 4
    assert drive([True] * 2, cfg, learner_version=45) == [S, T, T, S]
    state = RecoveryState(no_progress_streak=10)
    assert state.next_actor(45, cfg, evaluating=True) == S and state.takeovers == 0
    assert drive([True] * 3, cfg.model_copy(update={"enabled": False})) == [S] * 3


def test_a_teacher_step_outside_a_takeover_and_unknown_actors_are_refused():
    with pytest.raises(ValueError, match="outside a takeover"):
        RecoveryState().record(T, True, RecoveryConfig())
    with pytest.raises(ValueError, match="actor must be"):
        RecoveryState().record("nobody", True, RecoveryConfig())


@settings(max_examples=80, deadline=None)
@given(flags=st.lists(st.booleans(), max_size=40), p=st.integers(1, 4), m=st.integers(1, 6),
       teacher_np=st.booleans(), back=st.booleans())
def test_takeovers_need_p_no_progress_turns_and_never_exceed_m_per_rollout(flags, p, m, teacher_np, back):
    cfg = RecoveryConfig(enabled=True, patience=p, max_takeover=m, return_on_progress=back)
    actors = drive(flags, cfg, teacher_no_progress=teacher_np)
    assert actors.count(T) <= m
    streak, student_i = 0, 0
    for j, actor in enumerate(actors):
        if actor == T:
            if actors[j - 1] == S:
                assert streak >= p  # a takeover starts only after p consecutive no-progress student turns
            streak = 0
        else:
            streak = streak + 1 if flags[student_i] else 0
            student_i += 1
    if not back:
        runs = "".join("T" if a == T else "S" for a in actors).split("S")
        assert sum(1 for r in runs if r) <= 1  # without return_on_progress a takeover spends the whole cap


# ---------------------------------------------------------------------------- through the explorer
class Scripted:
    """A generation backend that answers every prompt with the next action of a script (then ``then``)."""

    def __init__(self, tok, script: list[str], then: str | None = None) -> None:
        self.tok, self.script, self.then, self.calls = tok, list(script), then, 0

    def generate(self, prompts, **kw):
        from divopd.explore.generation import Generation
        from divopd.explore.prompting import decode_action, encode_action

        out = []
        for _ in prompts:
            self.calls += 1
            if not self.script and self.then is None:
                raise AssertionError("Scripted: no action left")
            action = self.script.pop(0) if self.script else self.then
            resp = encode_action(self.tok, action)
            if decode_action(self.tok, resp) != action:  # the word tokenizer knows some words only after a space
                resp = encode_action(self.tok, " " + action)
            out.append(Generation(resp, np.zeros(len(resp), np.float32), True))
        return out


def _task_starting_in_room_0(env: TinyEnv) -> str:
    for task in env.tasks("train"):
        start, coin = env._layout(task)
        if start == 0 and coin >= 2:
            return task
    raise AssertionError("no such task")


def test_explorer_episode_by_hand():
    """p = 2, m = 3, return_on_progress: the student says "look around" all along (a repeat with the same allowed
    actions from its second turn on); the teacher answers "take coin" (invalid: no coin in room 0), "move east",
    "move west"."""
    tok = env_tokenizer("tiny")
    env = TinyEnv(num_rooms=5)
    task = _task_starting_in_room_0(env)
    cfg = ExplorerConfig(env="tiny", num_envs=1, max_steps=14, generation={"max_new_tokens": 4},
                         recovery={"enabled": True, "patience": 2, "max_takeover": 3, "return_on_progress": True})
    with Explorer(cfg, tiny_model(tok, 0), tok, tiny_model(tok, 1), seed=0,
                  env_factory=lambda: TinyEnv(num_rooms=5)) as explorer:
        explorer._student_gen = Scripted(tok, [], then="look around")
        explorer._teacher_gen = teacher = Scripted(tok, ["take coin", "move east", "move west"])
        explorer._train_task_stream = lambda: iter([task] * 100)
        (rollout,) = explorer.collect(1)
        # steps 0-2 student (look x3: the 2nd and 3rd are no progress), 3-4 teacher (invalid, then a move: control
        # returns), 5-7 student (5 follows the teacher's move: progress; 6, 7 repeats), 8 teacher (the rollout's
        # last teacher turn), 9-13 student (9 follows the move; then repeats, but no teacher turn is left)
        assert [t.turn_index for t in rollout.turns] == [0, 1, 2, 5, 6, 7, 9, 10, 11, 12, 13]
        assert [t.info["progress"] for t in rollout.turns] == [True, False, False, True, False, False, True,
                                                               False, False, False, False]
        assert (rollout.info.teacher_turns, rollout.info.takeovers, rollout.info.horizon) == (3, 2, 14)
        assert teacher.calls == 3 and all(t.info["teacher_acted"] is False for t in rollout.turns)
        assert all(t.info["action"] == "look around" for t in rollout.turns)  # no teacher action became a row
        # evaluation is student-only: the teacher is never asked, whatever the student does
        explorer._teacher_gen = Scripted(tok, [])
        explorer.evaluate(tasks=[task])
        assert explorer._teacher_gen.calls == 0


def test_explorer_recovery_waits_for_the_learner_warmup():
    tok = env_tokenizer("tiny")
    cfg = ExplorerConfig(env="tiny", num_envs=2, max_steps=6, generation={"max_new_tokens": 4},
                         recovery={"enabled": True, "patience": 1, "max_takeover": 1, "warmup": 3})
    student = tiny_model(tok, 0)
    with Explorer(cfg, student, tok, tiny_model(tok, 1), seed=0) as explorer:
        explorer._student_gen = Scripted(tok, [], then="take coin")  # invalid: no episode starts in the coin's room
        explorer._teacher_gen = Scripted(tok, [], then="look around")
        assert all(r.info.teacher_turns == 0 for r in explorer.collect(3))
        explorer.set_weights(WeightHandle(3, student.state_dict()))  # the learner has made 3 updates
        later = explorer.collect(4)
        assert any(r.info.teacher_turns == 1 for r in later)
        assert all(r.info.teacher_turns <= 1 for r in later)
    with pytest.raises(ValueError, match="needs a teacher"):
        Explorer(cfg, tiny_model(tok, 0), tok, None)


@pytest.mark.parametrize("env_name", ["tiny", "twx"])
def test_random_students_trigger_recovery_within_the_cap(env_name):
    tok = env_tokenizer(env_name)
    p, m, max_steps = 2, 2, 10
    cfg = ExplorerConfig(env=env_name, num_envs=3, max_steps=max_steps, generation={"max_new_tokens": 4},
                         recovery={"enabled": True, "patience": p, "max_takeover": m})
    with Explorer(cfg, tiny_model(tok, 0), tok, tiny_model(tok, 1), seed=0) as explorer:
        rollouts = explorer.collect(6)
        teacher_turns = [r.info.teacher_turns for r in rollouts]
        assert sum(teacher_turns) > 0 and max(teacher_turns) <= m  # a random student stalls often enough
        for r in rollouts:
            assert r.info.student_turns + r.info.teacher_turns == r.info.horizon <= max_steps
            assert r.info.takeovers <= 1  # without return_on_progress one takeover spends the cap
        assert explorer.stats()["explorer/teacher_turns"] == sum(teacher_turns)
        before = explorer.stats()["explorer/teacher_turns"]
        explorer.evaluate(num_tasks=3)  # recovery is off during evaluation
        assert explorer.stats()["explorer/teacher_turns"] == before


# ---------------------------------------------------------------------------- the paper's settings
@pytest.mark.parametrize("env_name, triplet", [("alfworld", (4, 6, 0)), ("webshop", (4, 5, 45)),
                                               ("scienceworld", (2, 6, 120))])
def test_configs_carry_the_appendix_g_triplets(env_name, triplet):
    from divopd.train.config import load_config

    cfg = load_config(env_name, ["method=divopd-r"])
    r = cfg.explorer.recovery
    assert r.enabled and (r.patience, r.max_takeover, r.warmup) == triplet
    assert cfg.sampler_config().method == "divopd"
