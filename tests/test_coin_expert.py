"""The observable-state coin expert of ``divopd sft --expert explore``: exact small cases, and real episodes."""

from __future__ import annotations

import pytest

from divopd.explore.envs.coin_expert import coin_explorer_action, current_room, exits

KITCHEN = ("You are in the kitchen. In one part of the room you see a stove. \n"
           "To the East you see the pantry. To the West you see the corridor.")
PANTRY = "You are in the pantry. In one part of the room you see a shelf. \nTo the West you see the kitchen."
CORRIDOR = "You are in the corridor. You also see a hat rack. \nTo the East you see the kitchen."
MOVES_K = ["inventory", "look around", "move east", "move west"]


def test_parsing_of_rooms_and_exits() -> None:
    assert current_room(KITCHEN) == "kitchen" and current_room("Unknown action: I'm not sure what you mean.") is None
    assert exits(KITCHEN) == {"move east": "pantry", "move west": "corridor"}


def test_takes_the_coin_when_it_is_in_view() -> None:
    assert coin_explorer_action(KITCHEN, [], [*MOVES_K, "take coin"]) == "take coin"


def test_visits_unvisited_rooms_first_then_backtracks() -> None:
    assert coin_explorer_action(KITCHEN, [], MOVES_K) == "move east"  # first listed move to an unvisited room
    # in the pantry (dead end): back to the kitchen, the only way
    assert coin_explorer_action(KITCHEN, [("move east", PANTRY)], ["look around", "move west"]) == "move west"
    # back in the kitchen: the corridor is the room not yet visited
    history = [("move east", PANTRY), ("move west", KITCHEN)]
    assert coin_explorer_action(KITCHEN, history, MOVES_K) == "move west"
    # an unknown-action observation does not move the agent: the room is still the last one named
    history = [("move east", PANTRY), ("jump", "Unknown action: I'm not sure what you mean.")]
    assert coin_explorer_action(KITCHEN, history, ["look around", "move west"]) == "move west"


def test_all_neighbours_visited_goes_to_the_one_left_longest_ago() -> None:
    history = [("move east", PANTRY), ("move west", KITCHEN), ("move west", CORRIDOR), ("move east", KITCHEN)]
    assert coin_explorer_action(KITCHEN, history, MOVES_K) == "move east"  # pantry left at step 1, corridor at 3


@pytest.mark.parametrize("rooms", [3, 4])
def test_it_wins_every_real_episode_in_fewer_steps_than_gold(rooms: int) -> None:
    pytest.importorskip("textworld_express")
    from divopd.commands.sft import collect_gold_examples
    from divopd.explore.envs import make_env

    env = make_env("twx", game="coin", params=f"numLocations={rooms},numDistractorItems=0,includeDoors=0")
    try:
        tasks = env.tasks("train")[:40]
        explore, failed = collect_gold_examples(env, tasks, expert="explore", max_steps=30)
        gold, _ = collect_gold_examples(env, tasks)
    finally:
        env.close()
    assert failed == 0
    assert len(explore) < len(gold)
    assert all(r["action"] in r["valid"] for r in explore)


def _coin4_examples(*calls: dict) -> list[tuple[list[dict], int]]:
    """``collect_gold_examples`` on the first 30 train tasks of a real 4-room coin game, once per keyword set."""
    pytest.importorskip("textworld_express")
    from divopd.commands.sft import collect_gold_examples
    from divopd.explore.envs import make_env

    env = make_env("twx", game="coin", params="numLocations=4,numDistractorItems=0,includeDoors=0")
    try:
        tasks = env.tasks("train")[:30]
        return [collect_gold_examples(env, tasks, expert="explore", **kw) for kw in calls]
    finally:
        env.close()


def test_expert_noise_executes_perturbations_but_records_the_experts_labels() -> None:
    """--expert-noise (DART-style): some executed actions differ from the records' labels, invalid moves among them;
    every record's label is still the expert's action for the state it shows, and the same seed repeats the data."""
    (noisy, failed), (again, _) = _coin4_examples(*[{"max_steps": 16, "noise": 0.3, "seed": 3}] * 2)
    assert noisy == again
    assert 0 <= failed < 30
    labels = [r["action"] for r in noisy]
    assert all(a == coin_explorer_action(r["first"], r["history"], r["valid"])
               for a, r in zip(labels, noisy, strict=True))
    assert all(a in r["valid"] for a, r in zip(labels, noisy, strict=True))
    # (label of step t-1, action executed at step t-1) within each episode
    pairs = [(noisy[i - 1]["action"], r["history"][-1][0]) for i, r in enumerate(noisy) if r["history"]]
    assert any(label != executed for label, executed in pairs)  # perturbations were executed
    assert any("Unknown action" in obs for r in noisy for _, obs in r["history"])  # off-path states are recorded


def test_epsilon_move_replaces_only_moves_with_a_listed_move() -> None:
    import random

    from divopd.commands.sft import epsilon_move

    rng = random.Random(0)
    assert epsilon_move("take coin", [*MOVES_K, "take coin"], 1.0, rng) == "take coin"  # never replaces a take
    assert epsilon_move("move east", MOVES_K, 0.0, rng) == "move east"
    drawn = {epsilon_move("move east", MOVES_K, 1.0, rng) for _ in range(50)}
    assert drawn == {"move east", "move west"}  # only listed moves, uniformly: both show up in 50 draws


def test_expert_epsilon_records_the_executed_actions_of_a_weaker_searcher() -> None:
    """--expert-epsilon: every record's label is the action executed next (an epsilon-greedy searcher is cloned,
    not the expert), labels differ from the expert's only on moves, the coin is always taken when in view, and
    the same seed repeats the data."""
    eps = {"max_steps": 10, "epsilon": 0.8, "seed": 3}
    (data, failed), (again, _), (_, clean_failed) = _coin4_examples(eps, eps, {"max_steps": 10})
    assert data == again and clean_failed == 0 and failed > 0  # the weaker searcher fails some tasks
    experts = [coin_explorer_action(r["first"], r["history"], r["valid"]) for r in data]
    assert any(a != e for a, e in zip((r["action"] for r in data), experts, strict=True))
    for r, expert in zip(data, experts, strict=True):
        assert r["action"] in r["valid"]
        assert r["action"] == expert or (r["action"].startswith("move ") and expert.startswith("move "))
    executed = {(i, r["history"][-1][0]) for i, r in enumerate(data) if r["history"]}
    assert all(data[i - 1]["action"] == a for i, a in executed)


def test_miss_move_replaces_only_take_coin_with_a_listed_move() -> None:
    import random

    from divopd.commands.sft import miss_move

    rng = random.Random(0)
    assert miss_move("move east", MOVES_K, 1.0, rng) == "move east"  # never replaces a move
    assert miss_move("take coin", [*MOVES_K, "take coin"], 0.0, rng) == "take coin"
    assert miss_move("take coin", ["take coin"], 1.0, rng) == "take coin"  # no listed move: kept
    drawn = {miss_move("take coin", [*MOVES_K, "take coin"], 1.0, rng) for _ in range(50)}
    assert drawn == {"move east", "move west"}


def test_expert_miss_walks_past_the_coin_and_records_it() -> None:
    """--expert-miss: labels differ from the expert's only where the expert takes the coin (a listed move instead),
    each label is the action executed next, the walker fails more tasks as the probability grows, a zero probability
    leaves the data of --expert-epsilon unchanged, and the same seed repeats the data."""
    eps = {"max_steps": 10, "epsilon": 0.8, "seed": 3}
    miss = eps | {"miss": 0.7}
    (data, failed), (again, _), (plain, plain_failed), (zero, _), (never, never_failed) = _coin4_examples(
        miss, miss, eps, eps | {"miss": 0.0}, eps | {"miss": 1.0})
    assert data == again and zero == plain
    assert plain_failed < failed < never_failed == 30  # missing every coin wins nothing
    experts = [coin_explorer_action(r["first"], r["history"], r["valid"]) for r in data]
    missed = [(r, e) for r, e in zip(data, experts, strict=True) if r["action"] != e and e == "take coin"]
    assert missed and all(r["action"].startswith("move ") and r["action"] in r["valid"] for r, _ in missed)
    assert all(r["action"] == e or (r["action"].startswith("move ") and e.startswith("move "))
               for r, e in zip(data, experts, strict=True) if e != "take coin")
    executed = {(i, r["history"][-1][0]) for i, r in enumerate(data) if r["history"]}
    assert all(data[i - 1]["action"] == a for i, a in executed)
