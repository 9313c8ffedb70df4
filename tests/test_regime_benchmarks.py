"""The warm-start study of issue 17 (benchmarks/regime/): its plans pinned to what the docs say they run, and the
analysis scripts beside them (actions, coin_turns, sweep_tables, pair_reports) on exact small cases."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from divopd import bench
from divopd.bench import load_plan, plan_runs
from divopd.suite.models import RECIPES
from divopd.train.config import load_config

#: benchmarks/regime/: the warm-start study plans
REGIME = Path(bench.DEFAULT_PLAN).parents[1] / "regime"


def _script(name: str):
    """benchmarks/regime/<name>.py, loaded as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REGIME / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(text: str, marker: str) -> str:
    """The lines of a page between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    return text.split(f"<!-- {marker} -->\n")[1].split(f"\n<!-- /{marker} -->")[0]


def _dart_plan(name: str):
    """(plan, runs) of benchmarks/regime/plan-<name>.yaml, a study over configs/coin6-dart's 40-update runs."""
    plan = load_plan(REGIME / f"plan-{name}.yaml")
    assert plan.configs == "coin6-dart" and plan.cache == "cache/coin6-dart" and plan.updates == 40
    return plan, plan_runs(plan)


def _seeds_by_label(runs) -> dict[str, set[int]]:
    """label -> the seeds a plan runs it on."""
    seeds: dict[str, set[int]] = {}
    for r in runs:
        seeds.setdefault(r.label, set()).add(r.seed)
    return seeds


def test_the_actions_benchmark_counts_invalid_actions_and_what_follows_them(tmp_path) -> None:
    """benchmarks/regime/actions.py on a two-rollout log: exact shares."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from divopd.models.tiny import build_tokenizer

    actions = _script("actions")
    assert actions.valid_actions("x\nValid actions: look around, move east<eos><|assistant|>") == {
        "look around", "move east"}
    tok = build_tokenizer(["Valid actions: look around, move east, take coin", "Unknown action", "take coin",
                           "move east"])
    menu = "Valid actions: look around, move east"
    turns = [("a", 0, menu, "take coin"), ("a", 1, "Unknown action\n" + menu, "take coin"),
             ("a", 2, "Unknown action\n" + menu, "move east"), ("b", 0, menu + ", take coin", "take coin")]
    log = tmp_path / "experience"
    log.mkdir()
    pq.write_table(pa.table({
        "rollout_id": [t[0] for t in turns], "arrival_update": [1] * len(turns), "turn_index": [t[1] for t in turns],
        "prompt_ids": [tok.encode(t[2]) for t in turns], "response_ids": [tok.encode(t[3]) for t in turns]}),
        log / "part-000000.parquet")
    invalid, top, top_share, after = actions.run_shares(log, tok, last=20)
    assert (invalid, top, top_share, after) == (0.5, "take coin", 0.5, 0.5)


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
    plan, runs = _dart_plan("coin6-dart")
    main = [r for r in runs if r.kind == "main"]
    ten = {"vanilla", "nocap", "divopd-base", "divopd"}
    five = {"vanilla-pool", "divopd-r", "tcod-f2b", "turnopd", "top-b"}
    assert _seeds_by_label(main) == {**dict.fromkeys(ten, set(range(10))), **dict.fromkeys(five, set(range(5)))}
    # the load sweep: ~0.8 / 1.5 / 2.5 around the main runs' 64 env steps per update (~2), vanilla vs divopd-base
    load = [r for r in runs if r.kind == "load"]
    assert sorted({r.overrides[-1] for r in load}) == [f"runtime.lockstep.env_steps_per_update={n}"
                                                       for n in (26, 48, 80)]
    assert _seeds_by_label(load) == dict.fromkeys(("vanilla", "divopd-base"), set(range(5)))
    assert plan.sweeps.load.methods == ["vanilla", "divopd-base"] and len(load) == 3 * 2 * 5
    # the cap sweep: k = 4 is the main divopd run itself (shared), the other caps are new runs
    cap = [r for r in runs if r.kind == "cap"]
    assert _seeds_by_label(cap) == {f"divopd-k{k}": set(range(5)) for k in (2, 3, 4, 6)}
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


def test_the_coin_turns_benchmark_replays_each_run_under_its_rule(tmp_path, monkeypatch, capsys) -> None:
    """benchmarks/regime/coin_turns.py on a two-rollout log that one vanilla batch takes whole: exact shares of the
    turns with the coin in view and of those the student walked past."""
    from divopd.experience import Turn
    from divopd.experience.log import write_log
    from divopd.models.tiny import build_tokenizer
    from divopd.sampling import SamplerConfig

    monkeypatch.syspath_prepend(str(REGIME))  # the script imports its neighbour actions.py
    coin_turns = _script("coin_turns")
    tok = build_tokenizer(["Valid actions: move east, take coin", "take coin", "move east"])
    menu, coin = "Valid actions: move east", "Valid actions: move east, take coin"
    rows = [("a", 0, menu, "move east"), ("a", 1, coin, "move east"), ("a", 2, coin, "take coin"),
            ("b", 0, coin, "take coin")]
    turns = []
    for rid, index, prompt, action in rows:
        ids = tok.encode(action)
        turns.append(Turn(rollout_id=rid, turn_index=index, policy_version=0, prompt_ids=tok.encode(prompt),
                          response_ids=ids, student_logprobs=[-1.0] * len(ids), teacher_logprobs=[-2.0] * len(ids)))
    log = tmp_path / "experience.parquet"
    write_log(log, turns, write_ids=True)
    config = SamplerConfig("vanilla", batch_size=4, pool_factor=1, cap=4, max_staleness=2)
    assert coin_turns.coin_shares(log, config, tok) == (0.75, 0.75, 1 / 3, 1 / 3)
    config = SamplerConfig("vanilla", batch_size=8, pool_factor=1, cap=4, max_staleness=2)
    assert coin_turns.coin_shares(log, config, tok)[1] == 0.0  # too few turns for a batch: none trained
    # bad input: one line and exit 2 (a group folder that is not there, a tokenizer that is not there)
    for argv, start in (([str(tmp_path / "none"), "--tokenizer", "x"], "coin_turns: "),
                        ([str(tmp_path), "--tokenizer", str(tmp_path / "none")], "coin_turns: --tokenizer ")):
        monkeypatch.setattr("sys.argv", ["coin_turns.py", *argv])
        with pytest.raises(SystemExit) as exit_info:
            coin_turns.main()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith(start) and err.count("\n") == 1


def test_the_sweep_tables_script_prints_the_coin6_page_tables_from_the_committed_reports(capsys, monkeypatch) -> None:
    """benchmarks/regime/sweep_tables.py over plan-coin6.yaml and the committed reports (docs/results/regime): its
    Table 2 rows are the coin6 page's, value for value (the page's table was assembled by hand before the script), and
    its Table 19 has one row per k with the paper's k = 4 as the reference of the paired column."""
    sweep_tables = _script("sweep_tables")
    docs = REGIME.parents[1] / "docs" / "results"
    monkeypatch.setattr("sys.argv", ["sweep_tables.py", str(REGIME / "plan-coin6.yaml"), "--report",
                                     str(docs / "regime")])
    sweep_tables.main()
    load, cap = capsys.readouterr().out.strip().split("\n\n")
    page = (docs / "coin6.md").read_text()
    rows = load.splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| 26", "| 48", "| 64 (main runs)", "| 80"]
    assert all(row in page for row in rows)
    caps = cap.splitlines()[2:]
    assert [r.split(" | ")[0] for r in caps] == ["| 2", "| 3", "| 4 (the paper's)", "| 6"]
    assert caps[2].endswith("| – |") and all(r.endswith("p = 0.62 |") for r in caps[:2] + caps[3:])
    # a report folder without the groups: one line on stderr and exit 2, no traceback
    monkeypatch.setattr("sys.argv", ["sweep_tables.py", str(REGIME / "plan-coin6.yaml"), "--report",
                                     str(docs / "no-such-report")])
    with pytest.raises(SystemExit) as exit_info:
        sweep_tables.main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("sweep_tables: FileNotFoundError") and err.count("\n") == 1


def test_the_pool_regime_script_measures_runs_after_update_5(tmp_path, capsys) -> None:
    """benchmarks/regime/pool_regime.py --measure: per-update means after the first 5 updates, averaged over the runs
    of a method (the run folder's parent); turns per candidate rollout is the ratio of the two means."""
    pool_regime = _script("pool_regime")
    runs = []
    for seed, rollouts in ((0, 10.0), (1, 30.0)):
        run_dir = tmp_path / "divopd" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(f"setting: s\nmethod: divopd\nseed: {seed}\n")
        ups = [{"kind": "update", "update": u, "sampler/candidates": 100.0 * (u > 5) + 1.0,
                "sampler/candidate_rollouts": rollouts * (u > 5) + 1.0, "sampler/effective_rollouts": 8.0,
                "sampler/max_rollout_share": 0.25, "sampler/mean_staleness": 2.0 + seed,
                "queue/arrival_drain_ratio": 2.0, "ledger/expired": 10.0 * u, "ledger/received": 100.0 * u}
               for u in range(1, 9)]
        evals = [{"kind": "eval", "update": u, "eval/success_rate": 0.5} for u in (0, 8)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ups + evals))
        (run_dir / "summary.json").write_text("{}")
        runs.append(run_dir)
    pool_regime.print_measured(runs)
    row = capsys.readouterr().out.splitlines()[2]
    # after update 5: candidates 101, rollouts 11 and 31 (mean 21), age 2 and 3, expired 10%
    assert row == "| divopd | 2 | 21.0 | 8.00 | 0.25 | 2.00 | 10% | 101 | 4.8 | 2.50 |"


def test_the_coin6_dart_ctx_plan_is_coin6_dart_under_a_context_budget() -> None:
    """plan-coin6-dart-ctx.yaml: the study's rows over configs/coin6-dart, every run under the 480-token context budget
    (the only override), so its seeds pair with the main study's: the five controlled rows on 10 paired seeds, the
    other four on 5 (issue 17's counts)."""
    plan, runs = _dart_plan("coin6-dart-ctx")
    controlled = {"vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd"}
    others = {"divopd-r", "tcod-f2b", "turnopd", "top-b"}
    assert _seeds_by_label(runs) == {**dict.fromkeys(controlled, set(range(10))),
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
    assert _seeds_by_label(main) == _POOL_ROWS and all(r.group == group for r in main)
    assert {r.overrides for r in main} == {pool}
    cap = [r for r in runs if r.kind == "cap"]
    assert _seeds_by_label(cap) == {f"divopd-k{k}": set(range(5)) for k in (2, 4, 6)} and len(runs) == 60 + 15 + 30
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
    plan, runs = _dart_plan("coin6-dart-pool")
    pool = ("sampler.pool_factor=12", "sampler.max_staleness=6")
    _assert_pool_plan(runs, "coin6-dart-pool", pool)
    config = load_config("coin6-dart", list(pool))
    assert (config.sampler.pool_factor, config.sampler.max_staleness, config.sampler.cap) == (12, 6, 4)


def test_the_coin7_dart_pool_plan_is_coin7_dart_with_c_16_and_delta_8() -> None:
    """plan-coin7-dart-pool.yaml: coin7-dart's game (plan-coin7-dart.yaml's overrides) with c = 16 and delta = 8, the
    same rows and the same cap and load sweeps as the coin6-dart pool plan."""
    plan, runs = _dart_plan("coin7-dart-pool")
    game = {r.overrides for r in plan_runs(load_plan(REGIME / "plan-coin7-dart.yaml")) if r.group == "coin7-dart"}
    assert len(game) == 1
    _assert_pool_plan(runs, "coin7-dart-pool", (*game.pop(), "sampler.pool_factor=16", "sampler.max_staleness=8"))


@pytest.mark.parametrize("game", ["coin6-dart", "coin7-dart"])
def test_the_stale_plans_are_the_pool_plans_at_c_4(game: str) -> None:
    """plan-<game>-stale.yaml: divopd and divopd-base on 10 seeds with plan-<game>-pool.yaml's overrides except c
    (the paper's 4), so they pair with both the pool runs (same delta) and the main study (same c)."""
    plan, runs = _dart_plan(f"{game}-stale")
    assert _seeds_by_label(runs) == dict.fromkeys(("divopd", "divopd-base"), set(range(10)))
    pool = {r.overrides for r in plan_runs(load_plan(REGIME / f"plan-{game}-pool.yaml")) if r.kind == "main"}
    assert len(pool) == 1 and all(r.kind == "main" and r.group == f"{game}-stale" for r in runs)
    assert {r.overrides for r in runs} == {tuple(o for o in pool.pop() if not o.startswith("sampler.pool_factor="))}


def test_the_ctx_pool_plan_is_the_context_budget_in_the_pool_regime() -> None:
    """plan-coin6-dart-ctx-pool.yaml: the five controlled rows on 10 seeds with plan-coin6-dart-ctx.yaml's context
    budget and plan-coin6-dart-pool.yaml's c and delta, nothing else, so each run pairs with both plans' runs."""
    plan, runs = _dart_plan("coin6-dart-ctx-pool")
    rows = ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd")
    assert _seeds_by_label(runs) == dict.fromkeys(rows, set(range(10)))
    ctx = {r.overrides for r in plan_runs(load_plan(REGIME / "plan-coin6-dart-ctx.yaml"))}
    pool = {r.overrides for r in plan_runs(load_plan(REGIME / "plan-coin6-dart-pool.yaml")) if r.kind == "main"}
    assert len(ctx) == len(pool) == 1 and all(r.kind == "main" and r.group == "coin6-dart-ctx-pool" for r in runs)
    assert {r.overrides for r in runs} == {(*ctx.pop(), *pool.pop())}


def test_the_coin6_dart_sampled_plan_changes_only_the_estimator() -> None:
    """plan-coin6-dart-sampled.yaml: vanilla and divopd of configs/coin6-dart on seeds 0-4 with the paper's
    sampled-token estimator (the only override; the study's runs use top-k), so each run pairs with the study's run of
    the same method and seed."""
    plan, runs = _dart_plan("coin6-dart-sampled")
    assert sorted((r.label, r.seed) for r in runs) == [(m, s) for m in ("divopd", "vanilla") for s in range(5)]
    assert {r.overrides for r in runs} == {('learner.estimator="sampled"',)}
    for method in ("vanilla", "divopd"):
        assert load_config("coin6-dart", [f"method={method}"]).learner.estimator == "topk"


def test_the_pair_reports_script_pairs_two_groups_seed_by_seed(tmp_path, monkeypatch, capsys) -> None:
    """benchmarks/regime/pair_reports.py: only the seeds both groups finished are paired; exact means and count of
    seeds ahead; a missing file or group is one line and exit 2."""
    pair_reports = _script("pair_reports")

    def report(group: str, runs: dict[str, list[tuple[int, float, bool]]]) -> dict:
        return {"settings": {group: {"methods": {m: {"seeds": [
            {"seed": s, "finished": done, "peak_sr": v + 5, "final_five_mean": v + 1, "nauc": v} for s, v, done in rs]}
            for m, rs in runs.items()}}}}

    a = report("x", {"vanilla": [(0, 50.0, True), (1, 40.0, True), (2, 30.0, True), (3, 99.0, False)],
                     "divopd": [(0, 10.0, True)]})
    b = report("y", {"vanilla": [(0, 45.0, True), (1, 42.0, True), (3, 20.0, True), (4, 1.0, True)]})
    rows = pair_reports.pair_rows(pair_reports.finished_seeds(a, "x"), pair_reports.finished_seeds(b, "y"))
    assert len(rows) == 1 and rows[0]["seeds"] == [0, 1] and rows[0]["ahead"] == 1
    assert rows[0]["nauc"] == (45.0, 43.5) and rows[0]["peak_sr"] == (50.0, 48.5)
    # --against: every other method of a paired with one method (here a's own vanilla: seed 0 only for divopd)
    within = pair_reports.finished_seeds(a, "x")
    (row,) = pair_reports.pair_rows(within, within, against="vanilla")
    assert (row["method"], row["seeds"], row["nauc"], row["ahead"]) == ("divopd", [0], (10.0, 50.0), 0)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    monkeypatch.setattr("sys.argv", ["pair_reports.py", str(tmp_path / "a.json"), "x", str(tmp_path / "b.json"), "y"])
    pair_reports.main()
    assert "| vanilla | 2 | 50.0 / 48.5 | 46.0 / 44.5 | 45.0 / 43.5 | 1 of 2 | 1.000 |" in capsys.readouterr().out
    for argv in ([str(tmp_path / "none.json"), "x", str(tmp_path / "b.json"), "y"],
                 [str(tmp_path / "a.json"), "zz", str(tmp_path / "b.json"), "y"],
                 [str(tmp_path / "a.json"), "x", str(tmp_path / "b.json"), "y", "--against", "divopd"]):
        monkeypatch.setattr("sys.argv", ["pair_reports.py", *argv])
        with pytest.raises(SystemExit) as exit_info:
            pair_reports.main()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("pair_reports: ") and err.count("\n") == 1


def test_the_coin7_dart_plan_is_coin6_dart_on_a_larger_game() -> None:
    """plan-coin7-dart.yaml: the study's rows over configs/coin6-dart (its models, its learner) on coin with 7 rooms
    and a 20-step limit (the only two overrides; the base config has 6 rooms and 14 steps), the controlled rows on 10
    paired seeds and the other four on 5 (issue 17's counts; vanilla-pool on 5, as on coin6-dart); the load sweep
    (~0.8 / 1.5 / 2.5, vanilla vs divopd-base) and the cap sweep (k = 4 shared with the main divopd runs) on 5 seeds
    each, every run of them on the same 7-room game."""
    plan, runs = _dart_plan("coin7-dart")
    main = [r for r in runs if r.kind == "main"]
    ten = {"vanilla", "nocap", "divopd-base", "divopd"}
    five = {"vanilla-pool", "divopd-r", "tcod-f2b", "turnopd", "top-b"}
    assert _seeds_by_label(main) == {**dict.fromkeys(ten, set(range(10))), **dict.fromkeys(five, set(range(5)))}
    assert all(r.group == "coin7-dart" for r in main) and len(main) == 4 * 10 + 5 * 5
    game = ('explorer.env_kwargs.params="numLocations=7,numDistractorItems=0,includeDoors=0"', "explorer.max_steps=20")
    assert {r.overrides for r in main} == {game}
    load = [r for r in runs if r.kind == "load"]
    assert {r.overrides for r in load} == {(*game, f"runtime.lockstep.env_steps_per_update={n}") for n in (26, 48, 80)}
    assert _seeds_by_label(load) == dict.fromkeys(("vanilla", "divopd-base"), set(range(5))) and len(load) == 30
    cap = [r for r in runs if r.kind == "cap"]
    assert _seeds_by_label(cap) == {f"divopd-k{k}": set(range(5)) for k in (2, 3, 4, 6)}
    assert all((r.main is not None) == (r.label == "divopd-k4") for r in cap)
    assert {r.overrides for r in cap if r.main is None} == {(*game, f"sampler.cap={k}") for k in (2, 3, 6)}
    base = load_config("coin6-dart", ["method=vanilla"])
    assert base.explorer.max_steps == 14 and "numLocations=6" in base.explorer.env_kwargs["params"]


@pytest.mark.parametrize(("plan", "page", "marker", "caps"), [
    ("plan-coin7-dart.yaml", "coin7-dart.md", "coin7-dart", ["| 2", "| 3", "| 4 (the paper's)", "| 6"]),
    ("plan-coin6-dart-pool.yaml", "pool-regime.md", "coin6-dart-pool", ["| 2", "| 4 (the paper's)", "| 6"]),
    ("plan-coin7-dart-pool.yaml", "pool-regime.md", "coin7-dart-pool", ["| 2", "| 4 (the paper's)", "| 6"]),
])
def test_the_pages_sweep_tables_are_the_script_output(capsys, monkeypatch, plan: str, page: str, marker: str,
                                                       caps: list[str]) -> None:
    """The results pages' Table 2 and Table 19 (docs/results/coin7-dart.md over plan-coin7-dart.yaml,
    docs/results/pool-regime.md over plan-coin6-dart-pool.yaml and plan-coin7-dart-pool.yaml) are what
    sweep_tables.py prints from the committed reports (docs/results/regime), line for line, between the page's table
    markers."""
    sweep_tables = _script("sweep_tables")
    docs = REGIME.parents[1] / "docs" / "results"
    monkeypatch.setattr("sys.argv", ["sweep_tables.py", str(REGIME / plan), "--report", str(docs / "regime")])
    sweep_tables.main()
    tables = dict(zip(("load", "cap"), capsys.readouterr().out.strip().split("\n\n"), strict=True))
    text = (docs / page).read_text()
    for name, table in tables.items():
        assert _block(text, f"{marker} {name} table") == table
    assert [r.split(" | ")[0] for r in tables["load"].splitlines()[2:]] == ["| 26", "| 48", "| 64 (main runs)", "| 80"]
    assert [r.split(" | ")[0] for r in tables["cap"].splitlines()[2:]] == caps


def test_the_coin8_dart_pilot_plan_is_seed_0_at_two_learning_rates() -> None:
    """plan-coin8-dart.yaml, the pilot that collapsed: vanilla and divopd, seed 0, coin with 8 rooms and 24 steps at
    the setting's lr and at 1e-4."""
    runs = plan_runs(load_plan(REGIME / "plan-coin8-dart.yaml"))
    assert sorted((r.group, r.label, r.seed) for r in runs) == [
        (g, m, 0) for g in ("coin8-dart", "coin8-dart-lr1e-4") for m in ("divopd", "vanilla")]
    game = ('explorer.env_kwargs.params="numLocations=8,numDistractorItems=0,includeDoors=0"', "explorer.max_steps=24")
    assert {r.overrides for r in runs} == {game, (*game, "learner.lr=0.0001")}


def test_the_early_dip_is_the_first_sr_minus_the_lowest_in_the_window() -> None:
    """curves.py --dip: the lowest SR evaluated in updates 1..U and the first SR minus it, exactly."""
    early_dip = _script("curves").early_dip
    assert early_dip({0: 38.0, 5: 22.0, 10: 9.0, 15: 23.0}, 10) == (9.0, 29.0)
    assert early_dip({0: 38.0, 5: 22.0, 10: 9.0, 15: 5.0}, 5) == (22.0, 16.0)  # update 15 is outside the window
    assert early_dip({0: 30.0, 5: 40.0, 10: 45.0}, 10) == (40.0, -10.0)  # a run that only rises
    assert early_dip({0: 30.0, 20: 10.0}, 10) == (30.0, 0.0)  # no evaluation inside the window


def test_curves_reads_the_sr_curves_of_a_report_json(tmp_path, capsys, monkeypatch) -> None:
    """curves.py on a report.json: the per-seed ``sr_curve`` give the same dip table as the run folders would; a
    report without them, or an unknown setting, is one line and exit code 2."""
    curves = _script("curves")
    seeds = [{"seed": 0, "sr_curve": [[0, 38.0], [5, 22.0], [10, 9.0], [40, 50.0]]},
             {"seed": 1, "sr_curve": [[0, 30.0], [5, 40.0], [10, 45.0], [40, 55.0]]}]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"settings": {"g": {"methods": {"vanilla": {"seeds": seeds}}}}}))
    assert curves.report_curves(report, None) == {"vanilla": {0: {0: 38.0, 5: 22.0, 10: 9.0, 40: 50.0},
                                                              1: {0: 30.0, 5: 40.0, 10: 45.0, 40: 55.0}}}
    assert curves.report_curves(report, "g", seeds={1}) == {"vanilla": {1: {0: 30.0, 5: 40.0, 10: 45.0, 40: 55.0}}}
    monkeypatch.setattr("sys.argv", ["curves.py", str(report), "--dip", "10"])
    curves.main()
    # first SR (38 + 30) / 2, lowest in updates 1-10 (9 + 40) / 2, drop (29 - 10) / 2 (seed 1 only rises)
    assert capsys.readouterr().out.splitlines()[-1] == "| vanilla | 2 | 34.0 | 24.5 | 9.5 | 1 of 2 (seed 0) |"
    monkeypatch.setattr("sys.argv", ["curves.py", str(report), "--setting", "nope"])
    with pytest.raises(SystemExit) as e:
        curves.main()
    assert e.value.code == 2 and "no setting 'nope'" in capsys.readouterr().err
    del seeds[0]["sr_curve"]
    report.write_text(json.dumps({"settings": {"g": {"methods": {"vanilla": {"seeds": seeds}}}}}))
    monkeypatch.setattr("sys.argv", ["curves.py", str(report)])
    with pytest.raises(SystemExit) as e:
        curves.main()
    assert e.value.code == 2 and "no sr_curve" in capsys.readouterr().err


@pytest.mark.parametrize(("page", "links"), [("README.md", "docs/results/"), ("docs/results/index.md", "")])
def test_the_headline_table_is_the_script_output(page: str, links: str) -> None:
    """The README's and the results index's headline table is what headline.py prints from the committed reports,
    line for line; its links resolve from the page."""
    table = _script("headline").table(REGIME.parents[1] / "docs" / "results" / "regime", links)
    path = REGIME.parents[1] / page
    assert _block(path.read_text(), "headline table") == table and len(table.splitlines()) == 2 + 12
    assert all((path.parent / link).is_file() for link in re.findall(r"\]\(([^)]+)\)", table))


def test_the_headline_cells_mark_the_direction_and_the_ties() -> None:
    """headline.contrast: bold only for p < 0.05 the paper's way, "(reverse)" the other way, "equal" when every pair
    ties, "–" when the contrast was not run."""
    contrast = _script("headline").contrast
    test = {"metric": "nauc", "method": "divopd", "against": "vanilla", "n": 10}
    assert contrast([{**test, "mean_method": 48.69, "mean_against": 44.7, "p_value": 0.0254}],
                    "divopd", "vanilla") == "**48.7 vs 44.7, p = 0.025**"
    assert contrast([{**test, "mean_method": 44.7, "mean_against": 48.69, "p_value": 0.0254}],
                    "divopd", "vanilla") == "44.7 vs 48.7, p = 0.025 (reverse)"
    assert contrast([{**test, "mean_method": 44.7, "mean_against": 48.69, "p_value": 0.43}],
                    "divopd", "vanilla") == "44.7 vs 48.7, p = 0.43"
    assert contrast([{**test, "n": 0, "mean_method": 1.0, "mean_against": 1.0, "p_value": None}],
                    "divopd", "vanilla") == "equal"
    assert contrast([{**test, "metric": "tokens_to_target", "p_value": 0.01}], "divopd", "vanilla") == "–"


def test_the_early_collapse_table_is_what_the_committed_curves_give() -> None:
    """docs/results/pool-regime.md's early-collapse table: each cell is curves.collapses over the seeds 0-4 curves
    (``sr_curve``) of the committed reports (coin7-dart-dip for (4, 2) and (16, 8), coin7-dart-stale for (4, 8))."""
    curves = _script("curves")
    docs = REGIME.parents[1] / "docs" / "results"
    text = (docs / "pool-regime.md").read_text()
    block = _block(text, "coin7-dart dip table")
    sources = {"(4, 2)": ("coin7-dart-dip", "coin7-dart"), "(4, 8)": ("coin7-dart-stale", None),
               "(16, 8)": ("coin7-dart-dip", "coin7-dart-pool")}
    rows = [line.strip("| ").split(" | ") for line in block.splitlines()[2:]]
    assert [r[0] for r in rows] == list(sources)
    checked = 0
    for cd, *cells in rows:
        report, setting = sources[cd]
        table = curves.report_curves(docs / "regime" / report / "report.json", setting, seeds=set(range(5)))
        for method, cell in zip(("vanilla", "divopd", "divopd-base"), cells, strict=True):
            if method in table:
                assert cell.strip("*") == curves.collapses(table[method], 10), (cd, method)
                checked += 1
    assert checked == 8  # every cell but vanilla at (4, 8): vanilla reads no pool, so c does not change it
