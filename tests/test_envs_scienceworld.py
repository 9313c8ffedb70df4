"""ScienceWorld adapter on the real package (one JVM per test module; the long sweep is marked slow)."""

from __future__ import annotations

import pytest

from divopd.explore.envs import SPLITS, EnvCrash, make_env


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
    import torch

    from divopd.explore.envs.tiny import env_corpus
    from divopd.explore.explorer import Explorer, ExplorerConfig
    from divopd.models.tiny import build_model, build_tokenizer
    from divopd.sampling import gate

    torch.set_num_threads(1)
    kwargs = {"task_names": ["find-living-thing"]}
    tok = build_tokenizer(env_corpus("scienceworld", kwargs, episodes=2, steps=3), kind="word")
    cfg = ExplorerConfig(env="scienceworld", env_kwargs=kwargs, num_envs=2, max_steps=5,
                         generation={"max_new_tokens": 6}, prompt={"max_prompt_tokens": 4096})
    with Explorer(cfg, build_model(tok, "0.2m", seed=0), tok, build_model(tok, "0.2m", seed=1)) as explorer:
        rollouts = explorer.collect(3)
    for r in rollouts:
        assert r.info.horizon == 5 and [t.turn_index for t in r.turns] == list(range(5))
        assert all(gate.check(t) is None for t in r.turns)


def test_scienceworld_paper_split_counts_types_and_order(sw):
    import importlib

    from divopd.explore.envs.scienceworld import (
        PAPER_HELD_OUT_TYPES,
        PAPER_TRAIN_TYPES,
        scienceworld_paper_split,
        variation_counts,
    )

    assert importlib.import_module("divopd.explore.envs").scienceworld_paper_split is scienceworld_paper_split
    counts = variation_counts(sw)
    assert len(counts) == 30 and set(PAPER_TRAIN_TYPES) | set(PAPER_HELD_OUT_TYPES) == set(counts)
    training, held_out = scienceworld_paper_split(seed=42, env=sw)
    assert (len(training), len(held_out)) == (2294, 1308)  # Appendix Table 6 with scienceworld 1.2.3
    train_types, held_types = {n for n, _ in training}, {n for n, _ in held_out}
    assert (len(train_types), len(held_types)) == (17, 13) and not train_types & held_types
    for items in (training, held_out):
        assert len(set(items)) == len(items)
        for name in {n for n, _ in items}:  # the first half of each type's variations, all of it
            assert sorted(v for n, v in items if n == name) == list(range(counts[name] // 2))
    # deterministic, seeded, and the first held-out instances (the evaluation set's head) are stable
    assert scienceworld_paper_split(seed=42, env=sw) == (training, held_out)
    assert scienceworld_paper_split(seed=43, env=sw)[1] != held_out
    assert held_out[:5] == [("find-non-living-thing", 140), ("inclined-plane-friction-unnamed-surfaces", 30),
                            ("find-animal", 12), ("mendelian-genetics-unknown-plant", 121),
                            ("measure-melting-point-unknown-substance", 85)]
    assert training[:3] == [("test-conductivity", 194), ("inclined-plane-friction-named-surfaces", 390),
                            ("find-plant", 147)]


def test_scienceworld_paper_split_scheme_lists_the_split_as_train_and_test():
    env = make_env("scienceworld", split_scheme="paper")
    try:
        train, test = env.tasks("train"), env.tasks("test")
        assert (len(train), len(test)) == (2294, 1308)
        assert test[:2] == ["find-non-living-thing:140", "inclined-plane-friction-unnamed-surfaces:30"]
        with pytest.raises(ValueError, match="only 'train' and 'test'"):
            env.tasks("dev")
        assert env.reset(test[0]).startswith("Your task is to find")
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown split_scheme"):
        make_env("scienceworld", split_scheme="paper-ish")
