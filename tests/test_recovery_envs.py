"""+R reporting of each adapter: what an invalid action is (``info["invalid"]``) and what the allowed actions are
(``Env.allowed_actions_key``), on the real packages where they are installed."""

from __future__ import annotations

import importlib.util

import pytest

from divopd.explore.envs import make_env
from divopd.explore.envs.alfworld import TextWorldGamesEnv
from divopd.explore.envs.base import action_in
from divopd.explore.envs.tiny import TinyEnv
from divopd.explore.envs.webshop import OfflineWebShopEnv, webshop_action_available


def test_action_in_ignores_case_and_spacing():
    assert action_in("  Move   East ", ["look around", "move east"])
    assert not action_in("move", ["move east"])


def test_tiny_invalid_is_outside_the_valid_list_and_allowed_is_that_list():
    env = TinyEnv(num_rooms=5)
    task = next(t for t in env.tasks("train") if env._layout(t)[0] == 0)
    env.reset(task)
    assert env.allowed_actions_key() == frozenset({"look around", "move east"})
    for action, invalid in [("move west", True), ("take coin", True), ("dance", True), ("look around", False),
                            ("Move East", False)]:
        assert env.step(action)[3]["invalid"] is invalid, action
    assert env.allowed_actions_key() == frozenset({"look around", "move east", "move west"})


def test_twx_invalid_is_outside_valid_actions_or_not_understood():
    env = make_env("twx")
    try:
        env.reset(env.tasks("train")[0])
        allowed = env.allowed_actions_key()
        assert allowed == frozenset(env.valid_actions())
        assert env.step("fly to the moon")[3]["invalid"] is True
        assert env.allowed_actions_key() == allowed  # nothing happened
        assert env.step("look around")[3]["invalid"] is False
    finally:
        env.close()


@pytest.mark.skipif(importlib.util.find_spec("scienceworld") is None, reason="scienceworld not installed")
def test_scienceworld_invalid_is_the_parsers_refusal_and_allowed_is_look_and_inventory():
    env = make_env("scienceworld", task_names=["boil"])
    try:
        env.reset(env.tasks("train")[0])
        before = env.allowed_actions_key()
        assert isinstance(before, tuple) and "This room is called" in before[0]
        obs, _, _, info = env.step("fly to the moon")
        assert obs == "No known action matches that input." and info["invalid"] is True
        assert env.allowed_actions_key() == before
        assert env.step("look around")[3]["invalid"] is False
        obs, _, _, info = env.step("go to kitchen")  # parsed, but the door is closed: not invalid
        assert info["invalid"] is False and env.allowed_actions_key() == before
    finally:
        env.close()


def test_webshop_invalid_is_a_rejected_or_unavailable_action():
    available = {"has_search_bar": False, "clickables": ["back to search", "Next >"]}
    assert webshop_action_available("click[next >]", available)
    assert webshop_action_available(" Click[ Back  to search ] ", available)
    assert not webshop_action_available("search[red shoes]", available)
    assert not webshop_action_available("click[buy now]", available)
    assert not webshop_action_available("buy it", available)
    assert webshop_action_available("search[x]", {"has_search_bar": True, "clickables": []})
    env = OfflineWebShopEnv(seed=0, n_products=40, n_goals=20, n_test=5, n_dev=5)
    try:
        env.reset(env.tasks("train")[0])
        allowed = env.allowed_actions_key()
        assert allowed == frozenset({"search[<query>]"})
        assert env.step("click[buy now]")[3]["invalid"] is True  # nothing to click on the search page
        assert env.allowed_actions_key() == allowed
        assert env.step("search[shirt]")[3]["invalid"] is False
        assert env.allowed_actions_key() != allowed
    finally:
        env.close()


class _FakeGame:
    """Stands in for a textworld game: "go north" works, anything else is "Nothing happens."."""

    def __init__(self) -> None:
        self.room = 0

    def step(self, action):
        if action == "go north":
            self.room += 1
            return {"feedback": f"Room {self.room}.", "admissible_commands": ["look", "go north"]}, 0, False
        return {"feedback": "Nothing happens.", "admissible_commands": ["look", "go north"]}, 0, False


def test_alfworld_invalid_is_not_admissible_or_nothing_happens():
    env = TextWorldGamesEnv.__new__(TextWorldGamesEnv)  # no textworld needed: the game is faked
    env._env, env._seen, env._won = _FakeGame(), set(), False
    env._state = {"feedback": "Room 0.", "admissible_commands": ["look", "go north"]}
    assert env.allowed_actions_key() == frozenset({"look", "go north"})
    assert env.step("go north")[3]["invalid"] is False
    assert env.step("take apple")[3]["invalid"] is True  # not admissible (and "Nothing happens.")
    assert env.step("look")[3]["invalid"] is True  # admissible, but the game says "Nothing happens."
