"""ScienceWorld adapter on the real package (one JVM per test module; the long sweep is marked slow)."""

from __future__ import annotations

import pytest

from divopd.envs import SPLITS, EnvCrash, make_env


@pytest.fixture(scope="module")
def sw():
    env = make_env("scienceworld", task_names=["find-living-thing"])
    yield env
    env.close()


def test_scienceworld_gold_path_episode_succeeds(sw):
    task = sw.tasks("train")[0]
    gold = sw.gold_actions(task)
    first = sw.reset(task)
    assert first.startswith("Your task is to find")
    scores = []
    for action in gold:
        obs, reward, done, info = sw.step(action)
        scores.append(info["score"])
        if done:
            break
    assert done and info["success"] and scores[-1] == 1.0
    assert scores == sorted(scores)  # the gold path never loses points
    # a bad action is feedback, not an exception, and the second episode starts from a zero score
    sw.reset(task)
    obs, reward, done, info = sw.step("fly to the moon")
    assert obs and not done and info["score"] == 0.0 and info["progress"] is False
    assert "open OBJ" in sw.valid_actions()


def test_scienceworld_splits_are_the_package_variations(sw):
    train, dev, test = (set(sw.tasks(s)) for s in SPLITS)
    assert train and dev and test and not (train & dev) and not (dev & test)
    with pytest.raises(ValueError, match="variation out of range"):
        sw.reset("find-living-thing:100000")


def test_scienceworld_close_ends_the_jvm():
    env = make_env("scienceworld", task_names=["boil"])
    proc = env._env._gateway.java_process
    env.close()
    assert proc.poll() is not None
    with pytest.raises(EnvCrash):
        env.reset("boil:0")


@pytest.mark.slow
def test_scienceworld_gold_paths_win_across_tasks():
    env = make_env("scienceworld")
    try:
        names = env.task_names[::3]
        for name in names:
            task = next(t for t in env.tasks("dev") if t.startswith(name + ":"))
            gold = env.gold_actions(task)
            env.reset(task)
            for action in gold:
                _, _, done, info = env.step(action)
                if done:
                    break
            assert info["success"], (task, info)
    finally:
        env.close()


@pytest.mark.slow
def test_random_student_explores_scienceworld_with_well_formed_turns():
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_explorer import env_texts
    from divopd import gate
    from divopd.explorer import Explorer, ExplorerConfig
    from divopd.models.tiny import build_model, build_tokenizer

    torch.set_num_threads(1)
    kwargs = {"task_names": ["find-living-thing"]}
    tok = build_tokenizer(env_texts("scienceworld", kwargs, episodes=2, steps=3), kind="word")
    cfg = ExplorerConfig(env="scienceworld", env_kwargs=kwargs, num_envs=2, max_steps=5,
                         generation={"max_new_tokens": 6}, prompt={"max_prompt_tokens": 4096})
    with Explorer(cfg, build_model(tok, "0.2m", seed=0), tok, build_model(tok, "0.2m", seed=1)) as explorer:
        rollouts = explorer.collect(3)
    for r in rollouts:
        assert r.info["horizon"] == 5 and [t.turn_index for t in r.turns] == list(range(5))
        assert all(gate.check(t) is None for t in r.turns)
