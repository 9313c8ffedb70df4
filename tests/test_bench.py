"""``divopd bench paper``: plan validation, run expansion, dry-run listing, skip/resume, per-group reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from divopd.cli import main
from divopd.suite.plan import DEFAULT_PLAN, PlanError, load_plan, plan_runs, select_runs
from divopd.suite.report import _group_runs, measured_best_cap, write_reports
from divopd.suite.runs import dry_run_text, run_config, run_state, train_runs

SMALL = {
    "out": "runs/x",
    "updates": 2,
    "seeds": [0, 1],
    "settings": {"a": {}, "b": {"overrides": {"explorer.max_steps": 10}}},
    "methods": [
        {"method": "vanilla"},
        {"method": "divopd-base"},
        {"label": "divopd-tokens", "method": "divopd", "overrides": {"sampler.cap_unit": "tokens"}},
    ],
    "sweeps": {
        "load": {"setting": "a", "key": "explorer.num_envs", "values": [4, 16], "methods": ["vanilla", "divopd-base"]},
        "cap": {"setting": "a", "method": "divopd", "values": [2, 4]},
    },
}


def write_plan(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_plan_is_valid_and_covers_the_issue() -> None:
    plan = load_plan(DEFAULT_PLAN)
    runs = plan_runs(plan)
    assert len(plan.settings) >= 2 and len(plan.seeds) >= 3
    labels = {r.label for r in runs if r.kind == "main"}
    assert {"vanilla", "divopd-base", "divopd", "nocap", "divopd-r", "tcod-f2b", "divopd-tokens"} <= labels
    assert len({r.group for r in runs if r.kind == "load"}) == 3
    assert sorted({r.label for r in runs if r.kind == "cap"}) == ["divopd-k2", "divopd-k3", "divopd-k4", "divopd-k6"]
    assert len({r.key for r in runs}) == len(runs)  # no two runs share a directory


def test_the_index_counts_a_sweep_point_shared_with_a_main_run_once(tmp_path) -> None:
    plan = load_plan(DEFAULT_PLAN)
    runs = plan_runs(plan)
    shared = [r for r in runs if r.main is not None]  # the cap sweep's k = 4 points are the main divopd runs
    assert shared and all(r.run_dir(tmp_path) == r.main.run_dir(tmp_path) for r in shared)
    text = write_reports(runs, plan, tmp_path).read_text()
    assert (f"Plan: {len(runs) - len(shared)} runs; runs in `{tmp_path}` ({len(shared)} sweep points are main runs, "
            "and appear in both groups).") in text


def test_a_method_row_can_have_its_own_seeds(tmp_path) -> None:
    data = json.loads(json.dumps(SMALL))
    data["methods"][0]["seeds"] = [5]
    runs = plan_runs(load_plan(write_plan(tmp_path, data)))
    assert {r.seed for r in runs if r.kind == "main" and r.label == "vanilla"} == {5}
    assert {r.seed for r in runs if r.kind == "main" and r.label == "divopd-base"} == {0, 1}


def test_expansion_groups_labels_and_overrides(tmp_path) -> None:
    runs = plan_runs(load_plan(write_plan(tmp_path, SMALL)))
    # 2 settings x 3 methods x 2 seeds + 2 loads x 2 methods x 2 seeds + 2 caps x 2 seeds
    assert len(runs) == 12 + 8 + 4
    tok = next(r for r in runs if r.label == "divopd-tokens" and r.group == "b" and r.seed == 1)
    assert tok.method == "divopd" and tok.config_setting == "b~divopd-tokens"
    assert tok.overrides == ('explorer.max_steps=10', 'sampler.cap_unit="tokens"')
    assert tok.run_dir("runs/x") == Path("runs/x/b/divopd-tokens/seed1")
    van = next(r for r in runs if r.label == "vanilla" and r.group == "a")
    assert van.config_setting == "a"
    load = [r for r in runs if r.kind == "load"]
    assert {r.group for r in load} == {"a-load-num_envs4", "a-load-num_envs16"}
    assert all(r.overrides[-1] in ("explorer.num_envs=4", "explorer.num_envs=16") for r in load)
    cap = [r for r in runs if r.kind == "cap"]
    assert {(r.group, r.label, r.overrides[-1]) for r in cap} == {
        ("a-cap", "divopd-k2", "sampler.cap=2"), ("a-cap", "divopd-k4", "sampler.cap=4")}


def test_run_config_puts_the_run_where_the_plan_says(tmp_path) -> None:
    plan = load_plan(write_plan(tmp_path, SMALL))
    models = {"student": tmp_path / "student", "teacher": tmp_path / "teacher"}
    for r in plan_runs(plan):
        cfg = run_config(r, plan, tmp_path / "out", models)
        assert cfg.resolved_run_dir() == r.run_dir(tmp_path / "out")
        assert (cfg.method, cfg.setting, cfg.seed, cfg.updates) == (r.method, r.config_setting, r.seed, 2)
    tok = next(r for r in plan_runs(plan) if r.label == "divopd-tokens")
    assert run_config(tok, plan, tmp_path, models).sampler.cap_unit == "tokens"


def test_sweep_points_equal_to_a_main_run_reuse_it(tmp_path, monkeypatch) -> None:
    data = json.loads(json.dumps(SMALL))
    data["methods"].append({"method": "divopd"})
    data["sweeps"]["load"].update(values=[8, 16], seeds=[1])  # the tiny configs run 8 envs
    data["sweeps"]["cap"].update(values=[3, 4])  # DivOPD's k is 4
    plan = load_plan(write_plan(tmp_path, data))
    runs = plan_runs(plan)
    out = tmp_path / "out"
    load = [r for r in runs if r.kind == "load"]
    assert {r.seed for r in load} == {1} and len(load) == 4
    shared = {r.key: r.main.key for r in runs if r.main is not None}
    assert shared == {"a-load-num_envs8/vanilla/seed1": "a/vanilla/seed1",
                      "a-load-num_envs8/divopd-base/seed1": "a/divopd-base/seed1",
                      "a-cap/divopd-k4/seed0": "a/divopd/seed0", "a-cap/divopd-k4/seed1": "a/divopd/seed1"}
    k4 = next(r for r in runs if r.key == "a-cap/divopd-k4/seed0")
    assert k4.run_dir(out) == out / "a" / "divopd" / "seed0"
    cfg = run_config(k4, plan, out, {"student": tmp_path / "s", "teacher": tmp_path / "t"})
    assert cfg.setting == "a" and cfg.resolved_run_dir() == out / "a" / "divopd" / "seed0"
    # selecting only the sweep trains the shared point once, as its main run; the dry run counts it once
    calls = []

    def fake_train(cfg=None, **kwargs):
        calls.append(cfg)
        cfg.resolved_run_dir().mkdir(parents=True)
        (cfg.resolved_run_dir() / "summary.json").write_text("{}")
        return {}

    monkeypatch.setattr("divopd.train.train", fake_train)
    chosen = select_runs(runs, ["a-cap", "a/divopd"])
    train_runs(chosen, plan, out, {"student": tmp_path / "s", "teacher": tmp_path / "t"})
    assert sorted(str(c.resolved_run_dir().relative_to(out)) for c in calls) == [
        "a-cap/divopd-k3/seed0", "a-cap/divopd-k3/seed1", "a/divopd/seed0", "a/divopd/seed1"]
    assert dry_run_text(chosen, out).endswith("4 runs: 4 done, 0 to resume, 0 to start")
    assert "(= main run a/divopd/seed0)" in dry_run_text(chosen, out)
    # a cap sweep over a method that is not a plain method row of the plan shares nothing
    assert not [r for r in plan_runs(load_plan(write_plan(tmp_path, SMALL))) if r.main is not None]


def _bad(**changes):
    data = json.loads(json.dumps(SMALL))
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split("__")
        for p in parents:
            node = node[p]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_bad(methods=[{"method": "nosuch"}]), r"unknown method 'nosuch'; known: vanilla, .*turnopd"),
        (_bad(configs="coin4", methods=[{"method": "nosuch"}]), r"unknown method 'nosuch'; known: .*nocap"),
        (_bad(sweeps__cap__method="nosuch"), r"unknown method 'nosuch'"),
        (_bad(methods=[{"method": "divopd"}, {"method": "divopd"}]), r"method labels repeat: \['divopd'\]"),
        (_bad(sweeps__cap__setting="zz"), r"cap sweep: setting 'zz' is not in settings"),
        (_bad(sweeps__load__setting="zz"), r"load sweep: setting 'zz' is not in settings"),
        (_bad(sweeps__load__methods=["nocap"]), r"load sweep: methods \['nocap'\] are not method labels"),
        (_bad(sweeps__cap__values=[0, 2]), r"every k must be >= 1"),
        (_bad(seeds=[]), r"seeds: List should have at least 1 item"),
        (_bad(seeds=[1, 1]), r"seeds must be distinct"),
        (_bad(sweeps__cap__seeds=[2, 2]), r"cap sweep: seeds must be distinct"),
        (_bad(sweeps__load__seeds=[]), r"load sweep: seeds must be distinct and >= 0"),
        (_bad(settings={"a/b": {}}), r"setting 'a/b': use a plain name"),
        (_bad(settings={"a": {}, "a-cap": {}}), r"setting names clash with sweep groups: \['a-cap'\]"),
        (_bad(typo=1), r"typo: Extra inputs are not permitted"),
        (_bad(settings={"settings": {}}), r"setting 'settings': the name is taken by a combined report"),
        (_bad(configs="nowhere"), r"configs 'nowhere': no packaged setting of that name; settings: alfworld"),
        (_bad(configs="alfworld"), r"configs 'alfworld': its models have no recipe in divopd.suite.models"),
        (_bad(methods=[{"method": "vanilla", "seeds": [3, 3]}]), r"method vanilla: seeds must be distinct"),
    ],
)
def test_plan_errors_name_the_problem(tmp_path, data, message) -> None:
    with pytest.raises(PlanError, match=message):
        load_plan(write_plan(tmp_path, data))


def test_unreadable_plans(tmp_path) -> None:
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(PlanError, match=r"the top level must be a mapping \(out, seeds"):
        load_plan(tmp_path / "list.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(PlanError, match="empty plan file"):
        load_plan(tmp_path / "empty.yaml")
    with pytest.raises(PlanError, match="not a plan file"):
        load_plan(tmp_path)


def test_only_filters_by_group_and_label(tmp_path) -> None:
    runs = plan_runs(load_plan(write_plan(tmp_path, SMALL)))
    assert {r.key for r in select_runs(runs, ["a/vanilla"])} == {"a/vanilla/seed0", "a/vanilla/seed1"}
    assert {r.group for r in select_runs(runs, ["*-cap"])} == {"a-cap"}
    assert {r.label for r in select_runs(runs, ["b"])} == {"vanilla", "divopd-base", "divopd-tokens"}
    assert len(select_runs(runs, ["a/vanilla", "a/vanilla"])) == 2
    assert {r.key for r in select_runs(runs, ["a/vanilla"], [1])} == {"a/vanilla/seed1"}
    assert {r.seed for r in select_runs(runs, None, [0])} == {0}
    with pytest.raises(PlanError, match="--seeds 7: no run of the plan has these seeds"):
        select_runs(runs, None, [7])
    with pytest.raises(PlanError, match="matches no run"):
        select_runs(runs, ["c/vanilla"])


def _fake_run(run_dir: Path, setting: str, method: str, seed: int, srs: list[float] | None, finished: bool) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"setting": setting, "method": method, "seed": seed}))
    if srs is not None:
        lines = [{"kind": "update", "update": u, "learner/tokens_total": 100 * u, "learner/compute_s_total": u}
                 for u in range(1, len(srs))]
        lines += [{"kind": "eval", "update": u, "eval/success_rate": sr} for u, sr in enumerate(srs)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if finished:
        (run_dir / "summary.json").write_text("{}")


def test_a_summary_short_of_the_configured_updates_is_resumed(tmp_path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text("updates: 150\n")
    (d / "summary.json").write_text('{"updates": 40}')
    assert run_state(d) == "partial"
    (d / "summary.json").write_text('{"updates": 150}')
    assert run_state(d) == "done"


def test_dry_run_lists_states_and_trains_nothing(tmp_path, capsys, monkeypatch) -> None:
    plan_path = write_plan(tmp_path, SMALL)
    out = tmp_path / "out"
    _fake_run(out / "a" / "vanilla" / "seed0", "a", "vanilla", 0, [0.1], finished=True)
    _fake_run(out / "a" / "vanilla" / "seed1", "a", "vanilla", 1, None, finished=False)
    monkeypatch.setattr("divopd.train.train", lambda *a, **k: pytest.fail("dry run trained"))
    assert main(["bench", "paper", "--plan", str(plan_path), "--out", str(out), "--dry-run", "--only", "a"]) == 0
    text = capsys.readouterr().out
    assert f"done    {out}/a/vanilla/seed0" in text
    assert f"partial {out}/a/vanilla/seed1" in text
    assert f"todo    {out}/a/divopd-tokens/seed0  [divopd sampler.cap_unit=\"tokens\"]" in text
    assert text.strip().endswith("6 runs: 1 done, 1 to resume, 4 to start")
    assert main(["bench", "paper", "--plan", str(plan_path), "--only", "nope", "--dry-run"]) == 2
    assert "matches no run" in capsys.readouterr().err


def test_finished_runs_are_skipped_and_partial_ones_resumed(tmp_path, monkeypatch) -> None:
    plan = load_plan(write_plan(tmp_path, SMALL))
    out = tmp_path / "out"
    runs = select_runs(plan_runs(plan), ["a/vanilla"])
    _fake_run(runs[0].run_dir(out), "a", "vanilla", 0, [0.1], finished=True)
    _fake_run(runs[1].run_dir(out), "a", "vanilla", 1, None, finished=False)
    extra = select_runs(plan_runs(plan), ["a-cap/divopd-k2"])[0]  # not started
    calls = []

    def fake_train(cfg=None, *, resume=None, progress=False):
        calls.append((cfg, resume))
        return {"peak_sr": 0.5, "arrival_drain_ratio": 1.5}

    monkeypatch.setattr("divopd.train.train", fake_train)
    models = {"student": tmp_path / "s", "teacher": tmp_path / "t"}
    train_runs([*runs, extra], plan, out, models)
    assert [run_state(r.run_dir(out)) for r in runs] == ["done", "partial"]
    assert len(calls) == 2
    assert calls[0] == (None, runs[1].run_dir(out))  # resumed from its directory
    cfg, resume = calls[1]
    assert resume is None and cfg.sampler.cap == 2 and cfg.resolved_run_dir() == extra.run_dir(out)


def test_a_piece_of_the_plan_trains_and_leaves_the_reports_alone(tmp_path, monkeypatch, capsys) -> None:
    """--only / --seeds train the selected runs and do not rewrite the reports (they would hold that piece alone);
    the whole plan, or --report, writes them. Training and the model build are stand-ins here."""
    plan_path = write_plan(tmp_path, SMALL)
    out = tmp_path / "out"
    trained: list[list[str]] = []
    monkeypatch.setattr("divopd.suite.models.prepare_models", lambda *a, **k: {})
    monkeypatch.setattr("divopd.commands.bench.train_runs",
                        lambda runs, *a: trained.append([f"{r.group}/{r.label}/{r.seed}" for r in runs]))
    args = ["bench", "paper", "--plan", str(plan_path), "--out", str(out)]
    assert main([*args, "--only", "a/vanilla", "--seeds", "1"]) == 0
    assert trained == [["a/vanilla/1"]] and not (out / "report").exists()
    hint = f"reports not rewritten (`divopd bench paper --plan {plan_path} --out {out} --report` writes them"
    assert hint in capsys.readouterr().out
    assert main([*args, "--seeds", "0"]) == 0 and not (out / "report").exists()
    assert main([*args, "--report"]) == 0 and len(trained) == 2
    assert (out / "report" / "index.md").is_file()


def test_reports_relabel_variants_into_their_group(tmp_path, monkeypatch) -> None:
    """Which runs each group's report holds and what the index says of them. The PNGs are left out here (a stand-in
    for plot_setting: the plots themselves are tests/test_report.py's)."""
    monkeypatch.setattr("divopd.analysis.report.render.plot_setting", lambda *args: [])
    plan = load_plan(write_plan(tmp_path, SMALL))
    out = tmp_path / "out"
    runs = plan_runs(plan)
    srs = {"vanilla": [0.0, 0.2, 0.4], "divopd-tokens": [0.0, 0.5, 0.6], "divopd-k2": [0.0, 0.3, 0.3],
           "divopd-k4": [0.0, 0.6, 0.5]}
    for r in runs:
        if r.seed == 0 and r.label in srs and r.kind in ("main", "cap") and r.group in ("a", "a-cap"):
            _fake_run(r.run_dir(out), r.config_setting, r.method, r.seed, srs[r.label], finished=True)
    index = write_reports(runs, plan, out)
    rep = json.loads((out / "report" / "a" / "report.json").read_text())
    assert set(rep["settings"]) == {"a"}
    assert set(rep["settings"]["a"]["methods"]) == {"vanilla", "divopd-tokens"}
    assert (out / "report" / "a-cap" / "report.md").is_file()
    text = index.read_text()
    assert f"Plan: {len(runs)} runs; runs in `{out}`." in text  # no sweep point is a main run here
    assert "[a](a/report.md): 2 runs (2 finished), baseline vanilla" in text
    assert "[a-cap](a-cap/report.md): 2 runs (2 finished), baseline divopd-k2" in text
    assert "- a: no finished vanilla run with an experience log yet" in text
    assert "[settings](settings/report.md)" not in text  # one setting has runs: no cross-setting report
    _fake_run(out / "b" / "vanilla" / "seed0", "b", "vanilla", 0, [0.0, 0.4, 0.4], finished=True)
    _fake_run(out / "b" / "divopd-base" / "seed0", "b", "divopd-base", 0, [0.0, 0.2, 0.5], finished=True)
    text = write_reports(runs, plan, out).read_text()
    assert "[settings](settings/report.md)" in text
    both = json.loads((out / "report" / "settings" / "report.json").read_text())
    assert set(both["settings"]) == {"a", "b"}
    assert "Geometric-mean speedups across settings" in (out / "report" / "settings" / "report.md").read_text()
    best, means = measured_best_cap(_group_runs(runs, out)["a-cap"])
    assert best == 4 and means == {2: 30.0, 4: 60.0}
