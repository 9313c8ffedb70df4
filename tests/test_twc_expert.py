"""The observable-state twc expert of ``divopd sft --expert explore``: exact small cases, and real episodes."""

from __future__ import annotations

import pytest

from divopd.explore.envs.twc_expert import putaway_goal, twc_putaway_action

GOAL = ("clean brown shirt", "wardrobe")
ON_FLOOR = ["inventory", "look around", "open chest of drawers", "open wardrobe", "take clean brown shirt"]
HELD_CLOSED = ["inventory", "look around", "open chest of drawers", "open wardrobe", "put clean brown shirt in bed"]
HELD_OPEN = ["inventory", "look around", "open chest of drawers", "put clean brown shirt in bed",
             "put clean brown shirt in wardrobe"]
TWC_PARAMS = "numLocations=1,numItemsToPutAway=1,includeDoors=0,limitInventorySize=0"


def test_the_goal_is_the_gold_paths_last_put() -> None:
    gold = ["look around", "take clean brown shirt", "open wardrobe", "put clean brown shirt in wardrobe"]
    assert putaway_goal(gold) == GOAL
    assert putaway_goal(["look around", "take flour", "put flour in shelf"]) == ("flour", "shelf")
    with pytest.raises(ValueError, match="no 'put"):
        putaway_goal(["look around", "take flour"])


def test_put_then_open_then_take_then_look() -> None:
    assert twc_putaway_action(GOAL, HELD_OPEN) == "put clean brown shirt in wardrobe"  # held, container open
    assert twc_putaway_action(GOAL, HELD_CLOSED) == "open wardrobe"  # held, container closed: never the wrong put
    assert twc_putaway_action(GOAL, ON_FLOOR) == "open wardrobe"  # opening first is as good as taking first
    assert twc_putaway_action(GOAL, [a for a in ON_FLOOR if a != "open wardrobe"]) == "take clean brown shirt"
    assert twc_putaway_action(GOAL, ["inventory", "look around"]) == "look around"


def test_it_wins_every_real_episode_and_recovers_from_perturbations() -> None:
    """Noise 0: every episode succeeds in one step fewer than the gold path (no opening 'look around'), with valid
    actions only. Noise 0.3: some executed actions are not the labels, wrong puts among them, and each label is the
    expert's action for the state its record shows; the same seed repeats the data."""
    pytest.importorskip("textworld_express")
    from divopd.commands.sft import collect_gold_examples
    from divopd.explore.envs import make_env

    env = make_env("twx", game="twc", params=TWC_PARAMS, dev_from_train=200)
    try:
        tasks = env.tasks("train")[:40]
        clean, failed = collect_gold_examples(env, tasks, expert="explore", max_steps=5, game="twc")
        gold, _ = collect_gold_examples(env, tasks)
        noisy = {t: collect_gold_examples(env, [t], expert="explore", max_steps=5, noise=0.3, seed=i,
                                          game="twc")[0] for i, t in enumerate(tasks)}
        again = collect_gold_examples(env, tasks[:1], expert="explore", max_steps=5, noise=0.3, seed=0,
                                      game="twc")[0]
        goals = {t: putaway_goal(env.gold_actions(t)) for t in tasks}
    finally:
        env.close()
    assert failed == 0 and len(clean) == len(gold) - len(tasks)
    assert all(r["action"] in r["valid"] for r in clean)
    assert again == noisy[tasks[0]]
    assert all(r["action"] == twc_putaway_action(goals[t], r["valid"]) for t, rs in noisy.items() for r in rs)
    records = [r for rs in noisy.values() for r in rs]
    pairs = [(records[i - 1]["action"], r["history"][-1][0]) for i, r in enumerate(records) if r["history"]]
    assert any(label != executed for label, executed in pairs)  # perturbations were executed
    wrong = [(t, a) for t, rs in noisy.items() for r in rs for a, _ in r["history"]
             if a.startswith("put ") and a != f"put {goals[t][0]} in {goals[t][1]}"]
    assert wrong  # off-path states (the object put in a wrong container) are recorded, with the expert's labels
