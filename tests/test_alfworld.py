"""ALFWorld adapter: the setup error paths (always), game discovery, and, when the optional `alfworld` / `textworld`
packages are installed, a tiny ALFWorld game and a tiny tw-make game built offline in the test and played through it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from divopd.explore.envs.alfworld import (
    ALFWORLD_TASK_TYPES,
    AlfWorldEnv,
    AlfWorldSetupError,
    alfworld_games,
    alfworld_progress,
)

HAVE_ALFWORLD = importlib.util.find_spec("alfworld") is not None
HAVE_TEXTWORLD = importlib.util.find_spec("textworld") is not None
SPLITS = ("train", "valid_seen", "valid_unseen")


def _write_game(root: Path, split: str, task: str, trial: str = "trial_T0", *, task_type: str = "pick_and_place_simple",
                solvable: bool = True, game: dict | None = None) -> Path:
    d = root / "json_2.1.1" / split / task / trial
    d.mkdir(parents=True, exist_ok=True)
    params = {"object_target": "Apple", "parent_target": "Fridge", "toggle_target": "", "mrecep_target": "",
              "object_sliced": False}  # read by the package's hand-coded expert
    (d / "traj_data.json").write_text(json.dumps({"task_type": task_type, "pddl_params": params}))
    (d / "game.tw-pddl").write_text(json.dumps(game or {"pddl_domain": "", "grammar": "", "pddl_problem": "",
                                                        "solvable": solvable}))
    return d


# ------------------------------------------------------------------------------------------------ error paths
def test_without_alfworld_data_it_fails_fast_naming_what_to_set(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(AlfWorldSetupError) as e:
        AlfWorldEnv()
    msg = str(e.value)
    assert "ALFWORLD_DATA is not set" in msg
    assert "alfworld-download" in msg and "pip install 'divopd[alfworld]'" in msg


def test_a_data_folder_without_the_splits_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    with pytest.raises(AlfWorldSetupError) as e:
        AlfWorldEnv()
    assert str(tmp_path) in str(e.value) and "json_2.1.1/{valid_seen,valid_unseen}" in str(e.value)
    with pytest.raises(AlfWorldSetupError, match="does not exist"):
        alfworld_games(tmp_path, "test")


@pytest.mark.skipif(HAVE_ALFWORLD, reason="the alfworld package is installed: the missing-package path cannot occur")
def test_with_data_but_without_the_package_it_says_what_to_install(tmp_path):
    for split in SPLITS:
        _write_game(tmp_path, split, "pick_and_place_simple-Apple-None-Fridge-1")
    with pytest.raises(AlfWorldSetupError, match=r"pip install 'divopd\[alfworld\]'"):
        AlfWorldEnv(data_dir=tmp_path)


# ------------------------------------------------------------------------------------------------ discovery
def test_games_are_listed_and_filtered_as_the_package_does(tmp_path):
    _write_game(tmp_path, "valid_seen", "pick_and_place_simple-Apple-None-Fridge-1")
    _write_game(tmp_path, "valid_seen", "pick_and_place_simple-Apple-None-Fridge-1", "trial_T1", solvable=False)
    _write_game(tmp_path, "valid_seen", "pick_heat_then_place_in_recep-Egg-None-Fridge-2",
                task_type="pick_heat_then_place_in_recep")
    _write_game(tmp_path, "valid_seen", "pick_and_place_simple-AppleSliced-None-Fridge-3")
    _write_game(tmp_path, "valid_seen", "pick_and_place_with_movable_recep-Pen-Mug-Desk-4")
    (_write_game(tmp_path, "valid_seen", "pick_cool_then_place_in_recep-Pan-None-Fridge-5",
                 task_type="pick_cool_then_place_in_recep") / "game.tw-pddl").unlink()
    _write_game(tmp_path, "valid_unseen", "look_at_obj_in_light-Book-None-DeskLamp-6", task_type="look_at_obj_in_light")

    dev = alfworld_games(tmp_path, "dev")
    assert dev == [
        "valid_seen/pick_and_place_simple-Apple-None-Fridge-1/trial_T0",
        "valid_seen/pick_heat_then_place_in_recep-Egg-None-Fridge-2/trial_T0",
    ]
    assert alfworld_games(tmp_path, "valid_seen") == dev
    assert alfworld_games(tmp_path, "dev", task_types=["pick_and_place_simple"]) == dev[:1]
    assert alfworld_games(tmp_path, "test") == ["valid_unseen/look_at_obj_in_light-Book-None-DeskLamp-6/trial_T0"]
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        alfworld_games(tmp_path, "eval")
    with pytest.raises(ValueError, match="unknown ALFWorld task types"):
        alfworld_games(tmp_path, "dev", task_types=["make_coffee"])
    assert len(ALFWORLD_TASK_TYPES) == 6


def test_progress_is_a_new_observation_or_the_win():
    seen = {"You arrive at countertop 1."}
    assert alfworld_progress("You open the fridge 1.", seen, won=False) is True
    assert alfworld_progress("You arrive at countertop 1.", seen, won=False) is False
    assert alfworld_progress("Nothing happens.", set(), won=False) is False
    assert alfworld_progress("You arrive at countertop 1.", seen, won=True) is True


# ------------------------------------------------------------------------------------------------ real games
# A hand-written ALFRED PDDL problem: one apple on a countertop, a closed fridge, goal "apple in fridge". The domain and
# grammar are the files shipped inside the alfworld package; the names follow ALFRED's mangled ids so that the
# package's demangler turns them into "apple 1", "countertop 1", "fridge 1".
_APPLE = "Apple_bar__minus_01_dot_50_bar__plus_00_dot_94_bar__minus_00_dot_75"
_COUNTER = "CounterTop_bar__minus_01_dot_87_bar__plus_00_dot_95_bar__minus_01_dot_35"
_FRIDGE = "Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07"
_LOCS = ("loc_bar__minus_1_bar_3_bar_1_bar_45", "loc_bar__minus_4_bar_2_bar_2_bar_45",
         "loc_bar__minus_4_bar_5_bar_3_bar_45")
_PROBLEM = f"""(define (problem plan_tiny)
(:domain alfred)
(:objects agent1 - agent {_APPLE} - object AppleType - otype CounterTopType - rtype FridgeType - rtype
 {_COUNTER} - receptacle {_FRIDGE} - receptacle {_LOCS[0]} - location {_LOCS[1]} - location {_LOCS[2]} - location)
(:init (atLocation agent1 {_LOCS[0]})
 (receptacleType {_COUNTER} CounterTopType) (receptacleType {_FRIDGE} FridgeType) (objectType {_APPLE} AppleType)
 (canContain FridgeType AppleType) (canContain CounterTopType AppleType) (pickupable {_APPLE}) (openable {_FRIDGE})
 (receptacleAtLocation {_COUNTER} {_LOCS[1]}) (receptacleAtLocation {_FRIDGE} {_LOCS[2]})
 (inReceptacle {_APPLE} {_COUNTER}) (objectAtLocation {_APPLE} {_LOCS[1]}))
(:goal (and (exists (?r - receptacle) (exists (?o - object)
 (and (inReceptacle ?o ?r) (objectType ?o AppleType) (receptacleType ?r FridgeType))))))
)
"""


@pytest.fixture()
def tiny_alfworld(tmp_path, monkeypatch):
    if not HAVE_ALFWORLD:
        pytest.skip("the optional `alfworld` package is not installed (pip install 'divopd[alfworld]'); "
                    "the error paths above run without it")
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    grammar = Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", "put an apple in fridge")
    game = {"pddl_domain": Path(ALFRED_PDDL_PATH).read_text(), "grammar": grammar, "pddl_problem": _PROBLEM,
            "solvable": True}
    for split in SPLITS:
        _write_game(tmp_path, split, "pick_and_place_simple-Apple-None-Fridge-1", game=game)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    env = AlfWorldEnv()
    yield env
    env.close()


def test_tiny_alfworld_game_gold_path_wins(tiny_alfworld):
    env = tiny_alfworld
    task = env.tasks("test")[0]
    obs = env.reset(task)
    assert "Your task is to: put an apple in fridge." in obs
    assert "go to countertop 1" in env.valid_actions()
    gold = env.gold_actions(task)
    assert gold and gold[-1] == "move apple 1 to fridge 1"
    obs, reward, done, info = env.step("fly to the moon")
    assert obs == "Nothing happens." and info["progress"] is False and not done
    for action in gold:
        obs, reward, done, info = env.step(action)
        assert info["progress"] is True, action
    assert done and reward == 1.0 and info["success"] is True and info["score"] == 1.0


def test_tiny_alfworld_game_failed_episode(tiny_alfworld):
    env = tiny_alfworld
    env.reset(env.tasks("train")[0])
    for action in ["go to countertop 1", "take apple 1 from countertop 1", "go to countertop 1", "look"]:
        _, reward, done, info = env.step(action)
    assert not done and reward == 0.0 and info["success"] is False


def test_tiny_tw_make_game_walkthrough_wins(tmp_path):
    if not HAVE_TEXTWORLD:
        pytest.skip("the optional `textworld` package is not installed (the `alfworld` extra brings it)")
    from divopd.explore.envs.alfworld import TextWorldGamesEnv

    tw_make = Path(sys.executable).with_name("tw-make")
    tw_make = str(tw_make) if tw_make.exists() else shutil.which("tw-make")
    if tw_make is None:
        pytest.skip("textworld is importable but its `tw-make` script is not on PATH")
    game = tmp_path / "tiny.z8"
    subprocess.run([tw_make, "custom", "--world-size", "2", "--nb-objects", "2", "--quest-length", "2",
                    "--seed", "3", "--output", str(game), "-f", "--silent"], check=True, timeout=120,
                   capture_output=True)
    env = TextWorldGamesEnv([tmp_path])
    try:
        (task,) = env.tasks("train")
        env.reset(task)
        walkthrough = env.gold_actions(task)
        assert walkthrough
        for action in walkthrough:
            _, reward, done, info = env.step(action)
        assert done and reward == 1.0 and info["success"]
    finally:
        env.close()


def test_registry_name_reaches_the_same_error_path(monkeypatch):
    from divopd.explore.envs import make_env

    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(AlfWorldSetupError, match="ALFWORLD_DATA is not set"):
        make_env("alfworld")
