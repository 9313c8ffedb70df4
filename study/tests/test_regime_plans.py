"""The warm-start study's plans (study/regime/plan*.yaml) pinned to what the study's pages say they run: settings
folders, seeds per row, sweeps, overrides, and the configs each run resolves to."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_helpers import REGIME, dart_plan, seeds_by_label

from divopd.suite.models import RECIPES
from divopd.suite.plan import load_plan, plan_runs
from divopd.suite.runs import run_config
from divopd.train.config import load_config


def test_regime_plan_is_the_issue_17_study() -> None:
    """study/regime/plan.yaml: configs/coin4, >= 10 seeds for the five controlled rows, >= 5 for the others,
    two settings, a load sweep with three points and the cap sweep; its configs are the coin4 folder's."""
    plan = load_plan(REGIME / "plan.yaml")
    assert plan.configs == "coin4" and plan.config_file.stem == "coin4" and len(plan.settings) >= 2
    runs = plan_runs(plan)
    seeds: dict[str, set[int]] = {}
    for r in runs:
        if r.kind == "main" and r.group == "coin4":
            seeds.setdefault(r.label, set()).add(r.seed)
    for label in ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd"):
        assert len(seeds[label]) >= 10, label
    for label in ("divopd-r", "tcod-f2b", "turnopd", "top-b"):
        assert len(seeds[label]) >= 5, label
    assert len({r.group for r in runs if r.kind == "load"}) == 3
    models = {"student": Path("s"), "teacher": Path("t")}
    cfg = run_config(next(r for r in runs if r.label == "divopd"), plan, Path("out"), models)
    assert cfg.runtime.kind == "lockstep" and cfg.explorer.env_kwargs["params"].startswith("numLocations=4")
    ctx = run_config(next(r for r in runs if r.group == "coin4-ctx"), plan, Path("out"), models)
    assert ctx.explorer.prompt.max_prompt_tokens == 370 and ctx.explorer.truncated_turns_dead


@pytest.mark.parametrize(("plan_file", "configs", "game", "max_steps"), [
    ("plan-twc.yaml", "twc", "twc", 5), ("plan-coin6.yaml", "coin6", "coin", 14)])
def test_the_second_setting_plans_run_the_study_rows_on_their_own_configs(plan_file: str, configs: str, game: str,
                                                                          max_steps: int) -> None:
    """study/regime/plan-twc.yaml (configs/twc: another game, step limit 5, held-out tasks from the train fold)
    and plan-coin6.yaml (configs/coin6: 6 rooms, step limit 14): the same method rows and seed counts as the coin4
    study, lockstep, on their own settings folder and model cache."""
    plan = load_plan(REGIME / plan_file)
    assert plan.configs == configs and plan.cache == f"cache/{configs}"
    runs = plan_runs(plan)
    seeds: dict[str, set[int]] = {}
    for r in runs:
        seeds.setdefault(r.label, set()).add(r.seed)
    assert all(len(seeds[label]) >= 10 for label in ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd"))
    assert all(len(seeds[label]) >= 5 for label in ("divopd-r", "tcod-f2b", "turnopd", "top-b"))
    cfg = run_config(next(r for r in runs if r.label == "divopd"), plan, Path("out"),
                           {"student": Path("s"), "teacher": Path("t")})
    assert cfg.runtime.kind == "lockstep" and cfg.explorer.env_kwargs["game"] == game
    assert cfg.explorer.eval_split == "dev" and cfg.method == "divopd"
    assert cfg.explorer.max_steps == max_steps and cfg.sampler.batch_size == 32 and cfg.sampler.cap == 4
    if game == "twc":
        assert cfg.explorer.env_kwargs["dev_from_train"] > 0
    # the baselines' schedules fit the plan's run length: TurnOPD's loss reaches turn balance at the last update
    # (coin6, 60 updates: not coin4's 100), TCOD-F2B's curriculum reaches the full horizon before the run ends
    turnopd = run_config(next(r for r in runs if r.label == "turnopd"), plan, Path("out"),
                               {"student": Path("s"), "teacher": Path("t")})
    assert turnopd.updates == plan.updates and turnopd.learner.turn_balance_updates == plan.updates
    tcod = run_config(next(r for r in runs if r.label == "tcod-f2b"), plan, Path("out"),
                            {"student": Path("s"), "teacher": Path("t")})
    assert tcod.tcod.horizon(max_steps, update=plan.updates - 1) == max_steps


@pytest.mark.parametrize(("plan_file", "configs", "labels", "five_seed_labels", "max_prompt_tokens"), [
    ("plan-coin6-batch.yaml", "coin6", {"vanilla", "nocap", "divopd-base", "divopd"}, set(), 1024),
    ("plan-coin4-batch.yaml", "coin4", {"vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "tcod-f2b"},
     {"divopd-r", "turnopd", "top-b"}, 370)])
def test_the_one_version_per_rollout_plans_load_weights_per_batch(plan_file: str, configs: str, labels: set[str],
                                                                  five_seed_labels: set[str],
                                                                  max_prompt_tokens: int) -> None:
    """study/regime/plan-coin6-batch.yaml and plan-coin4-batch.yaml: the study rows on 10 paired seeds (coin4's
    other rows on 5, as issue 17 asks, but TCOD-F2B on 10), every run with explorer.load_weights = batch (one policy
    version per rollout); coin4's under the 370-token context budget (coin6 keeps the default 1024)."""
    plan = load_plan(REGIME / plan_file)
    assert plan.configs == configs and plan.cache == f"cache/{configs}"
    runs = plan_runs(plan)
    assert {r.label for r in runs} == labels | five_seed_labels
    assert all({r.seed for r in runs if r.label == label} == set(range(10)) for label in labels)
    assert all({r.seed for r in runs if r.label == label} == set(range(5)) for label in five_seed_labels)
    for r in runs:
        cfg = run_config(r, plan, Path("out"), {"student": Path("s"), "teacher": Path("t")})
        assert cfg.explorer.load_weights == "batch" and cfg.runtime.kind == "lockstep" and cfg.method == r.method
        assert cfg.explorer.prompt.max_prompt_tokens == max_prompt_tokens


def test_the_200_update_plan_is_coin4_ctx_batch_run_twice_as_long() -> None:
    """plan-coin4-batch-long.yaml: the same setting (context budget, one version per rollout) as plan-coin4-batch.yaml,
    vanilla and divopd on seeds 0-4, 200 updates, its own output folder (so its first 100 updates can be compared)."""
    short, long = load_plan(REGIME / "plan-coin4-batch.yaml"), load_plan(REGIME / "plan-coin4-batch-long.yaml")
    assert long.settings == short.settings and long.configs == short.configs and long.cache == short.cache
    assert long.updates == 2 * short.updates == 200 and long.out != short.out
    runs = plan_runs(long)
    assert {(r.label, r.seed) for r in runs} == {(m, s) for m in ("vanilla", "divopd") for s in range(5)}


def test_the_tail_plan_is_the_demo_setting_with_the_tail_estimator() -> None:
    """plan-coin4-tail.yaml: configs/coin4 unchanged except learner.topk_tail (the top-k estimator then sees the
    student's mass outside the teacher's top-k), vanilla and divopd on seeds 0-4, its own output folder."""
    plan = load_plan(REGIME / "plan-coin4-tail.yaml")
    assert plan.configs == "coin4" and plan.cache == "cache/coin4" and plan.updates == 100
    runs = plan_runs(plan)
    assert {(r.label, r.seed) for r in runs} == {(m, s) for m in ("vanilla", "divopd") for s in range(5)}
    for r in runs:
        cfg = run_config(r, plan, Path("out"), {"student": Path("s"), "teacher": Path("t")})
        demo = load_config("coin4", [f"method={r.method}"])
        assert cfg.learner.estimator == "topk" and cfg.learner.topk_tail and not demo.learner.topk_tail
        assert cfg.learner.model_dump() == demo.learner.model_dump() | {"topk_tail": True}
        assert cfg.explorer == demo.explorer and cfg.sampler == demo.sampler and cfg.runtime == demo.runtime


def test_the_coin4_dart_plan_and_settings_folder() -> None:
    """plan-coin4-dart.yaml: the controlled rows on 10 paired seeds (vanilla-pool on 5) over configs/coin4-dart,
    whose method rows are configs/coin4's; the setting differs from coin4 only in its models (recipe coin4-dart),
    60 updates and an evaluation every 5 updates."""
    plan = load_plan(REGIME / "plan-coin4-dart.yaml")
    assert plan.configs == "coin4-dart" and plan.cache == "cache/coin4-dart" and plan.updates == 60
    runs = plan_runs(plan)
    assert {r.label for r in runs} == {"vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd"}
    assert all({r.seed for r in runs if r.label == label} == set(range(10)) for label in
               {"vanilla", "nocap", "divopd-base", "divopd"})
    assert {r.seed for r in runs if r.label == "vanilla-pool"} == set(range(5))  # = vanilla without dead rows
    for name, dart, coin4 in _method_rows("coin4", "coin4-dart"):
        assert dart["setting"] == "coin4-dart" and dart["updates"] == 60 and dart["eval"]["every"] == 5
        assert dart["student"]["path"] == "cache/coin4-dart/student"
        assert dart["teacher"]["path"] == "cache/coin4-dart/teacher"
        _strip_setting(dart, coin4)
        assert dart == coin4, name


def _method_rows(base: str, variant: str) -> list[tuple[str, dict, dict]]:
    """(method, variant row, base row) for every method row on the packaged settings ``variant`` and ``base``."""
    from divopd.sampling import method_names

    return [(m, load_config(variant, [f"method={m}"]).model_dump(), load_config(base, [f"method={m}"]).model_dump())
            for m in method_names()]


def _strip_setting(*cfgs: dict, learner: tuple[str, ...] = (), tcod: tuple[str, ...] = ()) -> None:
    """Drop from each row what a setting folder may change: setting, updates, models, eval.every, TurnOPD's
    turn balance, and the given learner and tcod keys."""
    for cfg in cfgs:
        for key in ("setting", "updates", "student", "teacher"):
            cfg.pop(key)
        cfg["eval"].pop("every")
        for key in ("turn_balance_updates", *learner):
            cfg["learner"].pop(key)
        for key in tcod:
            cfg["tcod"].pop(key)


def test_the_coin6_dart_plan_and_settings_folder() -> None:
    """plan-coin6-dart.yaml: the controlled rows on 10 paired seeds (vanilla-pool, the other four rows and the cap sweep
    on 5, the load sweep on 5) over configs/coin6-dart, whose method rows are configs/coin6's; the setting differs from
    coin6 in its models (recipe coin6-dart, the student with --expert-miss), 40 updates, lr 3e-4, an evaluation every 5
    updates and the two schedules tied to the run's length (TurnOPD's turn balance at update 40, TCOD-F2B's eta 3
    reaching the 14-step horizon inside the run)."""
    plan, runs = dart_plan("coin6-dart")
    main = [r for r in runs if r.kind == "main"]
    ten = {"vanilla", "nocap", "divopd-base", "divopd"}
    five = {"vanilla-pool", "divopd-r", "tcod-f2b", "turnopd", "top-b"}
    assert seeds_by_label(main) == {**dict.fromkeys(ten, set(range(10))), **dict.fromkeys(five, set(range(5)))}
    # the load sweep: ~0.8 / 1.5 / 2.5 around the main runs' 64 env steps per update (~2), vanilla vs divopd-base
    load = [r for r in runs if r.kind == "load"]
    assert sorted({r.overrides[-1] for r in load}) == [f"runtime.lockstep.env_steps_per_update={n}"
                                                       for n in (26, 48, 80)]
    assert seeds_by_label(load) == dict.fromkeys(("vanilla", "divopd-base"), set(range(5)))
    assert plan.sweeps.load.methods == ["vanilla", "divopd-base"] and len(load) == 3 * 2 * 5
    # the cap sweep: k = 4 is the main divopd run itself (shared), the other caps are new runs
    cap = [r for r in runs if r.kind == "cap"]
    assert seeds_by_label(cap) == {f"divopd-k{k}": set(range(5)) for k in (2, 3, 4, 6)}
    assert all((r.main is not None) == (r.label == "divopd-k4") for r in cap)
    assert "--expert-miss" in RECIPES["coin6-dart"].student
    for name, dart, coin6 in _method_rows("coin6", "coin6-dart"):
        assert dart["setting"] == "coin6-dart" and dart["updates"] == 40 and dart["eval"]["every"] == 5
        assert dart["learner"]["lr"] == 3e-4 and coin6["learner"]["lr"] == 1e-3
        assert (dart["student"]["path"], dart["teacher"]["path"]) == ("cache/coin6-dart/student",
                                                                      "cache/coin6-dart/teacher")
        if dart["method"] == "tcod-f2b":
            eta = dart["tcod"]["eta"]
            assert 1 + 40 // eta >= dart["explorer"]["max_steps"] > 1 + 40 // (eta + 1)
        assert dart["learner"]["turn_balance_updates"] == (40 if dart["method"] == "turnopd" else None)
        _strip_setting(dart, coin6, learner=("lr",), tcod=("eta",))
        assert dart == coin6, name


def test_the_coin6_dart_ctx_plan_is_coin6_dart_under_a_context_budget() -> None:
    """plan-coin6-dart-ctx.yaml: the study's rows over configs/coin6-dart, every run under the 480-token context budget
    (the only override), so its seeds pair with the main study's: the five controlled rows on 10 paired seeds, the
    other four on 5 (issue 17's counts)."""
    plan, runs = dart_plan("coin6-dart-ctx")
    controlled = {"vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd"}
    others = {"divopd-r", "tcod-f2b", "turnopd", "top-b"}
    assert seeds_by_label(runs) == {**dict.fromkeys(controlled, set(range(10))),
                                     **dict.fromkeys(others, set(range(5)))}
    assert all(r.kind == "main" and r.group == "coin6-dart-ctx" for r in runs) and len(runs) == 5 * 10 + 4 * 5
    assert {r.overrides for r in runs} == {("explorer.prompt.max_prompt_tokens=480",)}


#: the pool plans' rows: the four controlled ones on 10 paired seeds (no vanilla-pool: without dead rows it equals
#: vanilla), the other four of issue 17 on 5
_POOL_ROWS = {**dict.fromkeys(("vanilla", "nocap", "divopd-base", "divopd"), set(range(10))),
              **dict.fromkeys(("divopd-r", "tcod-f2b", "turnopd", "top-b"), set(range(5)))}


def _assert_pool_plan(runs: list, group: str, pool: tuple[str, ...]) -> None:
    """A pool plan: :data:`_POOL_ROWS` in ``group`` with exactly the overrides ``pool``; a cap sweep at k = 2 and 6
    (k = 4 shares the main divopd runs) and a load sweep at 26/48/80 env steps per update for vanilla and
    divopd-base, on 5 seeds, each adding its one override to ``pool``."""
    main = [r for r in runs if r.kind == "main"]
    assert seeds_by_label(main) == _POOL_ROWS and all(r.group == group for r in main)
    assert {r.overrides for r in main} == {pool}
    cap = [r for r in runs if r.kind == "cap"]
    assert seeds_by_label(cap) == {f"divopd-k{k}": set(range(5)) for k in (2, 4, 6)} and len(runs) == 60 + 15 + 30
    assert all((r.main is not None) == (r.label == "divopd-k4") for r in cap)
    assert {r.overrides for r in cap if r.main is None} == {(*pool, f"sampler.cap={k}") for k in (2, 6)}
    steps = "runtime.lockstep.env_steps_per_update"
    assert {(r.label, r.seed, r.overrides) for r in runs if r.kind == "load"} == {
        (m, seed, (*pool, f"{steps}={v}"))
        for m in ("vanilla", "divopd-base") for seed in range(5) for v in (26, 48, 80)}


def test_the_coin6_dart_pool_plan_raises_only_c_and_delta() -> None:
    """plan-coin6-dart-pool.yaml: configs/coin6-dart's rows with c = 12 and delta = 6 (the only overrides), so its
    seeds pair with the main study's; a cap sweep at k = 2 and 6 and a load sweep at 26/48/80 env steps per update for
    vanilla and divopd-base, on 5 seeds (k = 4 and 64 steps are the main runs)."""
    plan, runs = dart_plan("coin6-dart-pool")
    pool = ("sampler.pool_factor=12", "sampler.max_staleness=6")
    _assert_pool_plan(runs, "coin6-dart-pool", pool)
    config = load_config("coin6-dart", list(pool))
    assert (config.sampler.pool_factor, config.sampler.max_staleness, config.sampler.cap) == (12, 6, 4)


def test_the_coin7_dart_pool_plan_is_coin7_dart_with_c_16_and_delta_8() -> None:
    """plan-coin7-dart-pool.yaml: coin7-dart's game (plan-coin7-dart.yaml's overrides) with c = 16 and delta = 8, the
    same rows and the same cap and load sweeps as the coin6-dart pool plan."""
    plan, runs = dart_plan("coin7-dart-pool")
    game = {r.overrides for r in plan_runs(load_plan(REGIME / "plan-coin7-dart.yaml")) if r.group == "coin7-dart"}
    assert len(game) == 1
    _assert_pool_plan(runs, "coin7-dart-pool", (*game.pop(), "sampler.pool_factor=16", "sampler.max_staleness=8"))


@pytest.mark.parametrize("game", ["coin6-dart", "coin7-dart"])
def test_the_stale_plans_are_the_pool_plans_at_c_4(game: str) -> None:
    """plan-<game>-stale.yaml: divopd and divopd-base on 10 seeds with plan-<game>-pool.yaml's overrides except c
    (the paper's 4), so they pair with both the pool runs (same delta) and the main study (same c)."""
    plan, runs = dart_plan(f"{game}-stale")
    assert seeds_by_label(runs) == dict.fromkeys(("divopd", "divopd-base"), set(range(10)))
    pool = {r.overrides for r in plan_runs(load_plan(REGIME / f"plan-{game}-pool.yaml")) if r.kind == "main"}
    assert len(pool) == 1 and all(r.kind == "main" and r.group == f"{game}-stale" for r in runs)
    assert {r.overrides for r in runs} == {tuple(o for o in pool.pop() if not o.startswith("sampler.pool_factor="))}


def test_the_ctx_pool_plan_is_the_context_budget_in_the_pool_regime() -> None:
    """plan-coin6-dart-ctx-pool.yaml: the five controlled rows on 10 seeds with plan-coin6-dart-ctx.yaml's context
    budget and plan-coin6-dart-pool.yaml's c and delta, nothing else, so each run pairs with both plans' runs."""
    plan, runs = dart_plan("coin6-dart-ctx-pool")
    rows = ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd")
    assert seeds_by_label(runs) == dict.fromkeys(rows, set(range(10)))
    ctx = {r.overrides for r in plan_runs(load_plan(REGIME / "plan-coin6-dart-ctx.yaml"))}
    pool = {r.overrides for r in plan_runs(load_plan(REGIME / "plan-coin6-dart-pool.yaml")) if r.kind == "main"}
    assert len(ctx) == len(pool) == 1 and all(r.kind == "main" and r.group == "coin6-dart-ctx-pool" for r in runs)
    assert {r.overrides for r in runs} == {(*ctx.pop(), *pool.pop())}


def test_the_coin6_dart_sampled_plan_changes_only_the_estimator() -> None:
    """plan-coin6-dart-sampled.yaml: vanilla and divopd of configs/coin6-dart on seeds 0-4 with the paper's
    sampled-token estimator (the only override; the study's runs use top-k), so each run pairs with the study's run of
    the same method and seed."""
    plan, runs = dart_plan("coin6-dart-sampled")
    assert sorted((r.label, r.seed) for r in runs) == [(m, s) for m in ("divopd", "vanilla") for s in range(5)]
    assert {r.overrides for r in runs} == {('learner.estimator="sampled"',)}
    for method in ("vanilla", "divopd"):
        assert load_config("coin6-dart", [f"method={method}"]).learner.estimator == "topk"


def test_the_coin7_dart_plan_is_coin6_dart_on_a_larger_game() -> None:
    """plan-coin7-dart.yaml: the study's rows over configs/coin6-dart (its models, its learner) on coin with 7 rooms
    and a 20-step limit (the only two overrides; the base config has 6 rooms and 14 steps), the controlled rows on 10
    paired seeds and the other four on 5 (issue 17's counts; vanilla-pool on 5, as on coin6-dart); the load sweep
    (~0.8 / 1.5 / 2.5, vanilla vs divopd-base) and the cap sweep (k = 4 shared with the main divopd runs) on 5 seeds
    each, every run of them on the same 7-room game."""
    plan, runs = dart_plan("coin7-dart")
    main = [r for r in runs if r.kind == "main"]
    ten = {"vanilla", "nocap", "divopd-base", "divopd"}
    five = {"vanilla-pool", "divopd-r", "tcod-f2b", "turnopd", "top-b"}
    assert seeds_by_label(main) == {**dict.fromkeys(ten, set(range(10))), **dict.fromkeys(five, set(range(5)))}
    assert all(r.group == "coin7-dart" for r in main) and len(main) == 4 * 10 + 5 * 5
    game = ('explorer.env_kwargs.params="numLocations=7,numDistractorItems=0,includeDoors=0"', "explorer.max_steps=20")
    assert {r.overrides for r in main} == {game}
    load = [r for r in runs if r.kind == "load"]
    assert {r.overrides for r in load} == {(*game, f"runtime.lockstep.env_steps_per_update={n}") for n in (26, 48, 80)}
    assert seeds_by_label(load) == dict.fromkeys(("vanilla", "divopd-base"), set(range(5))) and len(load) == 30
    cap = [r for r in runs if r.kind == "cap"]
    assert seeds_by_label(cap) == {f"divopd-k{k}": set(range(5)) for k in (2, 3, 4, 6)}
    assert all((r.main is not None) == (r.label == "divopd-k4") for r in cap)
    assert {r.overrides for r in cap if r.main is None} == {(*game, f"sampler.cap={k}") for k in (2, 3, 6)}
    base = load_config("coin6-dart", ["method=vanilla"])
    assert base.explorer.max_steps == 14 and "numLocations=6" in base.explorer.env_kwargs["params"]


def test_the_coin8_dart_pilot_plan_is_seed_0_at_two_learning_rates() -> None:
    """plan-coin8-dart.yaml, the pilot that collapsed: vanilla and divopd, seed 0, coin with 8 rooms and 24 steps at
    the setting's lr and at 1e-4."""
    runs = plan_runs(load_plan(REGIME / "plan-coin8-dart.yaml"))
    assert sorted((r.group, r.label, r.seed) for r in runs) == [
        (g, m, 0) for g in ("coin8-dart", "coin8-dart-lr1e-4") for m in ("divopd", "vanilla")]
    game = ('explorer.env_kwargs.params="numLocations=8,numDistractorItems=0,includeDoors=0"', "explorer.max_steps=24")
    assert {r.overrides for r in runs} == {game, (*game, "learner.lr=0.0001")}
