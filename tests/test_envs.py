"""Environment adapters: the protocol's rules on the tiny env, and gold-path episodes on real TextWorld-Express."""

from __future__ import annotations

import itertools
import logging

import pytest

from divopd.explore.envs import SPLITS, EnvCrash, ProgressTracker, make_env
from divopd.explore.envs._jvm import DEFAULT_JAVA_OPTS
from divopd.explore.envs.tiny import TinyEnv


def play(env, task: str, actions: list[str]) -> list[tuple[str, float, bool, dict]]:
    env.reset(task)
    out = []
    for a in actions:
        out.append(env.step(a))
        if out[-1][2]:
            break
    return out


# ---------------------------------------------------------------------------- protocol helpers
def test_progress_tracker_counts_score_rises_and_new_states_only():
    p = ProgressTracker()
    p.reset(0.0, "a")
    assert p.update(0.0, "b") is True  # new state
    assert p.update(0.0, "a") is False  # back to a seen state
    assert p.update(0.5, "a") is True  # score rose
    assert p.update(0.5, "a") is False
    assert p.update(0.2, "c") is True  # new state even if score fell
    assert p.update(0.4, "c") is False  # below the best score


def test_make_env_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        make_env("nope")


# ---------------------------------------------------------------------------- tiny
def test_tiny_gold_path_wins_every_task_of_every_split():
    env = make_env("tiny", num_rooms=6)
    for split in SPLITS:
        for task in env.tasks(split):
            steps = play(env, task, env.gold_actions(task))
            obs, reward, done, info = steps[-1]
            assert done and info["success"] and info["score"] == 1.0 and reward == 1.0, task
            assert all(s[3]["progress"] for s in steps), task  # every gold step is a new room or the coin


def test_tiny_splits_are_disjoint():
    env = TinyEnv()
    sets = [set(env.tasks(s)) for s in SPLITS]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])


def test_tiny_bad_actions_give_feedback_not_exceptions_and_no_progress():
    env = TinyEnv()
    task = env.tasks("train")[0]
    env.reset(task)
    for action in ["", "fly to the moon", "take coin", "look around"]:
        obs, reward, done, info = env.step(action)
        assert isinstance(obs, str) and obs and not done and not info["success"]
        assert info["progress"] is False


def test_tiny_crash_and_close_raise_env_crash():
    env = TinyEnv(crash_prob=1.0)
    env.reset(env.tasks("train")[0])
    with pytest.raises(EnvCrash):
        env.step("look around")
    env = TinyEnv()
    env.reset(env.tasks("train")[0])
    env.close()
    with pytest.raises(EnvCrash):
        env.step("look around")


def test_tiny_rejects_bad_task_and_split():
    env = TinyEnv()
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("eval")
    with pytest.raises(ValueError, match="bad task"):
        env.reset("nope")


# ---------------------------------------------------------------------------- TextWorld-Express (real package)
@pytest.fixture(scope="module")
def twx():
    env = make_env("twx")
    yield env
    env.close()


def test_twx_gold_path_wins_on_every_split(twx):
    for split in SPLITS:
        for task in twx.tasks(split)[:5]:
            gold = twx.gold_actions(task)
            assert 1 <= len(gold) <= 30
            first = twx.reset(task)
            assert "coin" in first and twx.valid_actions()
            steps = play(twx, task, gold)
            obs, reward, done, info = steps[-1]
            assert done and info["success"] and info["score"] == 1.0, (task, gold, obs)
            assert len(steps) == len(gold)


def test_twx_splits_come_from_the_package_folds(twx):
    train, dev, test = (set(twx.tasks(s)) for s in SPLITS)
    assert len(train) == len(dev) == len(test) == 1000
    assert not (train & dev) and not (dev & test) and not (train & test)


def test_twx_bad_action_is_feedback_with_no_progress(twx):
    twx.reset(twx.tasks("train")[0])
    obs, reward, done, info = twx.step("fly to the moon")
    assert "not sure" in obs and not done and reward == 0.0
    assert info == {"success": False, "progress": False, "score": 0.0, "failure": False, "invalid": True}
    obs, reward, done, info = twx.step("look around")
    assert info["progress"] is False  # same room, same inventory


def test_twx_cookingworld_gold_path_wins_and_score_rises():
    env = make_env("twx", game="cookingworld",
                   params="numLocations=1,numIngredients=1,numDistractorItems=0,includeDoors=0,limitInventorySize=0")
    try:
        task = env.tasks("dev")[0]
        steps = play(env, task, env.gold_actions(task))
        scores = [s[3]["score"] for s in steps]
        assert steps[-1][3]["success"] and scores[-1] == 1.0 and 0.0 < scores[len(scores) // 2] < 1.0
    finally:
        env.close()


_PRIVATE = itertools.count()


def private_twx(pool: int | None = None):
    """A twx env on the shared JVM of a pool no other test uses (a JVM option of its own; ``pool``: join that one),
    so the JVM ends with the close() of the pool's last env."""
    pool = next(_PRIVATE) if pool is None else pool
    return make_env("twx", java_opts_str=f"{DEFAULT_JAVA_OPTS} -Ddivopd.test={pool}")


def test_twx_close_ends_the_jvm_and_later_calls_crash():
    env = private_twx()
    proc = env._env._gateway.java_process
    env.reset(env.tasks("train")[0])
    env.close()
    assert proc.poll() is not None
    with pytest.raises(EnvCrash):
        env.step("look around")
    env.close()  # idempotent


def test_twx_killed_jvm_is_an_env_crash():
    env = private_twx()
    try:
        env.reset(env.tasks("train")[0])
        env._env._gateway.java_process.kill()
        env._env._gateway.java_process.wait()
        with pytest.raises(EnvCrash, match="jvm alive=False"):
            env.step("look around")
    finally:
        env.close()


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "never-closed"])
def test_twx_env_whose_jvm_died_is_collected_without_py4j_tracebacks(caplog, closed):
    # py4j's shutdown fails on a dead JVM before it marks its client disconnected; the Java objects still referenced
    # (here by the EnvCrash's traceback) then tried to reconnect from their finalizers, logging tracebacks at whatever
    # moment the collector ran (inside another ast.parse, that broke CPython 3.11's traceback formatting)
    import gc

    env = private_twx()
    env.reset(env.tasks("train")[0])
    proc = env._env._gateway.java_process
    proc.kill()
    proc.wait()
    with pytest.raises(EnvCrash) as crash:
        env.step("look around")
    if closed:
        env.close()
    caplog.clear()  # the failed step itself logs; what matters is what the collector does later
    with caplog.at_level(logging.DEBUG):
        del env, crash
        gc.collect()
    # at DEBUG, py4j logs every failed send to a dead JVM with its traceback
    assert not [r for r in caplog.records if r.name.startswith("py4j") and r.exc_info]


def test_twx_env_dropped_unclosed_with_a_live_jvm_still_ends_it_at_collection():
    import gc

    env = private_twx()
    proc = env._env._gateway.java_process
    del env
    gc.collect()
    assert proc.wait(timeout=30) is not None


def test_twx_instances_share_one_jvm_with_games_of_their_own():
    a = private_twx(100)
    b = private_twx(100)
    alone = make_env("twx", share_jvm=False)
    try:
        proc = a._env._gateway.java_process
        assert b._env._gateway.java_process is proc and alone._env._gateway.java_process is not proc
        ta, tb = a.tasks("train")[0], a.tasks("train")[1]
        first_a, first_b = a.reset(ta), b.reset(tb)
        steps_a = [a.step(x) for x in a.gold_actions(ta)]  # b's game is not touched by a's moves
        assert b.step("look around")[0] == (alone.reset(tb), alone.step("look around"))[1][0]
        assert first_a == alone.reset(ta) and steps_a[-1][3]["success"]
        assert first_b != first_a
        a.close()
        assert proc.poll() is None and b.step("look around")[0]  # the JVM lives on while b uses it
        b.close()
        assert proc.wait(timeout=30) is not None  # ... and ends with its last instance
    finally:
        for env in (a, b, alone):
            env.close()


def test_twx_killed_shared_jvm_fails_every_instance_and_the_next_gets_a_new_one():
    a, b = private_twx(101), private_twx(101)
    c = None
    try:
        a.reset(a.tasks("train")[0])
        b.reset(b.tasks("train")[0])
        old = a._env._gateway.java_process
        assert b._env._gateway.java_process is old
        old.kill()
        old.wait()
        for env in (a, b):
            with pytest.raises(EnvCrash):
                env.step("look around")
        c = private_twx(101)  # same pool: the dead JVM is replaced
        assert c._env._gateway.java_process is not old
        assert c.reset(c.tasks("train")[0]) and c.step("look around")[0]
    finally:
        for env in (a, b, c):
            if env is not None:
                env.close()


def test_twx_share_jvm_false_owns_its_jvm():
    env = make_env("twx", share_jvm=False)
    proc = env._env._gateway.java_process
    env.reset(env.tasks("train")[0])
    env.close()
    assert proc.wait(timeout=30) is not None
    with pytest.raises(ValueError, match="share_jvm"):
        make_env("twx", share_jvm="yes")


def test_twx_rejects_unknown_game_and_bad_task():
    with pytest.raises(ValueError, match="unknown game"):
        make_env("twx", game="zork")
    env = make_env("twx")
    try:
        with pytest.raises(ValueError, match="bad task"):
            env.reset("valid:3")
    finally:
        env.close()


def test_twx_dev_from_train_holds_out_the_train_folds_last_seeds():
    plain = make_env("twx")
    env = make_env("twx", dev_from_train=100)
    try:
        fold = plain.tasks("train")
        train, dev = env.tasks("train"), env.tasks("dev")
        assert train == fold[:-100] and dev == fold[-100:] and not set(train) & set(dev)
        assert env.tasks("test") == plain.tasks("test")
        assert env.reset(dev[0]) == plain.reset(dev[0])  # a held-out task is the train fold's own game
        assert plain.tasks("dev")[0].startswith("dev:")
    finally:
        env.close()
        plain.close()
    for bad in (-1, "3", True):
        with pytest.raises(ValueError, match="dev_from_train"):
            make_env("twx", dev_from_train=bad)
    env = make_env("twx", dev_from_train=len(fold))
    try:
        with pytest.raises(ValueError, match="leaves no train task"):
            env.tasks("train")
    finally:
        env.close()


def test_make_env_reports_bad_env_kwargs_as_config_errors():
    from divopd.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown environment 'mars'"):
        make_env("mars")
    with pytest.raises(ConfigError, match=r"environment 'tiny' \(TinyEnv\): bad env_kwargs \['colour'\]"):
        make_env("tiny", colour="red")
    with pytest.raises(ConfigError, match="environment 'tiny': TinyEnv: num_rooms must be >= 2"):
        make_env("tiny", num_rooms=1)
    assert make_env("tiny", num_rooms=3).num_rooms == 3
