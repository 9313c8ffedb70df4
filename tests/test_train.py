"""End-to-end tests of `divopd train`: config validation, every method row embedded, Ray, kill -9 and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from divopd.experience.log import read_log
from divopd.sampling import METHODS
from divopd.train.config import METHOD_ROWS, TrainConfig, apply_overrides, load_config

REPO = Path(__file__).resolve().parents[1]
PAPER_ROWS = ["vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "divopd-focus", "top-b", "divopd-r",
              "tcod-f2b", "turnopd"]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Random-init tiny student and teacher sharing a word-level tokenizer built from the tiny env's text."""
    from tiny_models import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("models"))


def tiny_config(models: dict[str, str], run_dir: Path, method: str, **over: object) -> TrainConfig:
    data = {
        "setting": "test-tiny",
        "method": method,
        "seed": 0,
        "updates": 3,
        "run_dir": str(run_dir),
        "student": {"path": models["student"]},
        "teacher": {"path": models["teacher"]},
        "sampler": {"batch_size": 6, "pool_factor": 4, "cap": 2, "max_staleness": 2},
        "learner": {"lr": 1e-3, **({"depth_stats": True, "turn_balance_updates": 3} if method == "turnopd" else {})},
        "turnopd": {"enabled": method == "turnopd", "rho": 0.5, "min_depth": 1},
        "explorer": {"env": "tiny", "num_envs": 3, "max_steps": 5,
                     "recovery": {"enabled": method == "divopd-r", "patience": 1, "max_takeover": 1}},
        "tcod": {"enabled": method == "tcod-f2b", "start_depth": 2},
        "eval": {"every": 3, "tasks": 3, "at_start": False},
        "checkpoint": {"every": 2, "keep": 1},
    }
    return load_config(data=data, overrides=[f"{k}={v}" for k, v in over.items()])


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_ledger_identity(ledger: dict) -> None:
    parts = ledger["selected"] + ledger["expired"] + ledger["invalid"] + ledger["pending"] + ledger["queued"]
    assert ledger["received"] == parts, ledger


# ---------------------------------------------------------------------------------------------------- config
def test_every_paper_row_is_a_known_method() -> None:
    for row in PAPER_ROWS:
        assert row in METHODS or row in METHOD_ROWS


def test_every_packaged_setting_validates_with_every_row() -> None:
    from divopd.sampling import method_names
    from divopd.train.packaged import CONFIGS, setting_names

    assert len(setting_names()) >= 9 and not list(CONFIGS.glob("*/"))  # one file per setting, no folders
    for setting in setting_names():
        assert load_config(setting).method == "divopd", setting  # the file's own row
        for method in method_names():
            cfg = load_config(setting, [f"method={method}"])
            assert cfg.method == method and cfg.sampler_config().method in METHODS


def test_a_saved_config_loads_back_unchanged_for_every_row(tmp_path: Path) -> None:
    """A run's config.yaml (what --resume reads) gives the same config again: the row's switches do not move a value
    the run saved (TurnOPD's schedule stays the setting's 150 updates of a 3-update run)."""
    from divopd.sampling import method_names
    from divopd.train.config import dump_config

    for method in method_names():
        cfg = load_config("tiny", [f"method={method}", "updates=3"])
        saved = tmp_path / f"{method}.yaml"
        saved.write_text(dump_config(cfg))
        assert load_config(saved) == cfg, method
    assert load_config(tmp_path / "turnopd.yaml").learner.turn_balance_updates == 150


def test_overrides_and_errors(tmp_path: Path) -> None:
    got = apply_overrides({"a": {"b": 1}}, ["a.b=6", "a.c=true", "d=[1, 2]"])
    assert got == {"a": {"b": 6, "c": True}, "d": [1, 2]}
    cfg = load_config("tiny", ["sampler.cap=6", "runtime.kind=ray"])
    assert cfg.sampler.cap == 6 and cfg.runtime.kind == "ray" and cfg.sampler_config().cap == 6
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_overrides({}, ["sampler.cap"])
    with pytest.raises(ValueError, match="unknown method"):
        load_config("tiny", ["method=fancy"])
    with pytest.raises(ValueError, match="unknown key sampler.kap; did you mean `sampler.cap`"):
        load_config("tiny", ["sampler.kap=3"])
    with pytest.raises(ValueError, match="recovery.enabled"):
        load_config("tiny", ["method=divopd-r", "explorer.recovery.enabled=false"])
    with pytest.raises(ValueError, match="tcod.enabled"):
        load_config("tiny", ["method=tcod-f2b", "tcod.enabled=false"])
    with pytest.raises(ValueError, match="no such config file or packaged setting; settings: alfworld, coin4"):
        load_config("tinyy")
    cyc = tmp_path / "a.yaml"
    cyc.write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        load_config(cyc)


def test_method_rows_map_to_sampler_rules() -> None:
    assert load_config("tiny", ["method=divopd-r"]).sampler_config().method == "divopd"
    assert load_config("tiny", ["method=tcod-f2b"]).sampler_config().method == "vanilla"
    turnopd = load_config("tiny", ["method=turnopd", "updates=3"])  # the schedule spans the file's updates, as before
    assert turnopd.learner.turn_balance_updates == 150 and turnopd.learner.depth_stats and turnopd.turnopd.enabled


def test_cli_rejects_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"setting": "x", "method": "divopd", "student": {"path": "s"}}))
    out = subprocess.run([sys.executable, "-m", "divopd", "train", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "teacher" in out.stderr


# ---------------------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("method", PAPER_ROWS)
def test_each_method_trains_embedded(tiny_models: dict[str, str], tmp_path: Path, method: str) -> None:
    from divopd.train import train

    run_dir = tmp_path / method
    summary = train(tiny_config(tiny_models, run_dir, method))
    assert summary["updates"] == 3 and not summary["interrupted"]
    assert_ledger_identity(summary["ledger"])
    records = read_metrics(run_dir)
    updates = [r for r in records if r["kind"] == "update"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["update"] for r in updates] == [1, 2, 3]
    assert all(r["sampler/rows"] == 6 for r in updates)
    assert updates[-1]["learner/tokens_total"] > updates[0]["learner/tokens_total"] > 0
    assert evals and evals[-1]["update"] == 3 and 0 <= evals[-1]["eval/success_rate"] <= 1
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (cfg["method"], cfg["setting"], cfg["seed"]) == (method, "test-tiny", 0)
    # every received turn is in the experience log, each arrival once
    arrivals = [t.arrival for t in read_log(run_dir / "experience")]
    assert arrivals == list(range(summary["ledger"]["received"]))
    assert (run_dir / "checkpoints" / "update-000003").is_dir() and (run_dir / "summary.json").is_file()
    if method == "divopd-r":
        assert updates[-1]["explorer/teacher_turns"] > 0
    if method in ("divopd", "divopd-base", "nocap", "vanilla-pool", "divopd-focus", "top-b"):
        assert all(r["sampler/candidates"] >= 6 for r in updates)
    if method == "divopd-focus":  # task-balance row weights (mean 1) reach the learner
        assert all(0 < r["learner/row_weight_min"] <= 1 <= r["learner/row_weight_max"] for r in updates)
    if method not in ("divopd-focus", "turnopd"):  # unit row weights: the learner's unweighted path
        assert all("learner/row_weight_max" not in r for r in updates)
    if method == "turnopd":  # the loss schedule runs from token-level (0) to turn-balanced (1) over the 3 updates
        assert [r["learner/turn_balance_alpha"] for r in updates] == [0.0, 0.5, 1.0]
        assert cfg["turnopd"]["enabled"] and cfg["learner"]["depth_stats"]


def test_diagnostics_every_n_updates(tiny_models: dict[str, str], tmp_path: Path) -> None:
    from divopd.train import train

    run_dir = tmp_path / "diag"
    train(tiny_config(tiny_models, run_dir, "divopd", **{"diagnostics.every": 2, "updates": 4}))
    updates = [r for r in read_metrics(run_dir) if r["kind"] == "update"]
    with_diag = [r["update"] for r in updates if "diag/grad_cos_pool" in r]
    assert with_diag == [2, 4]
    assert all(-1 <= r["diag/grad_cos_pool"] <= 1 for r in updates if "diag/grad_cos_pool" in r)
    assert all("diag/focus_spearman" in r for r in updates if r["update"] in (2, 4))


def test_existing_run_dir_needs_resume(tiny_models: dict[str, str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from divopd.train import train

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=2)
    train(cfg)
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg)
    cfg_path = tmp_path / "cfg.yaml"  # from the command line: one line naming --resume, exit 2, no traceback
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    from divopd.cli import main

    capsys.readouterr()
    assert main(["train", str(cfg_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "already holds a run" in err and "--resume" in err and "\n" not in err and "Traceback" not in err
    summary = train(resume=tmp_path / "run")  # finished run: nothing left to do, ledger intact
    assert summary["updates"] == 2 and summary["resumed"]
    assert_ledger_identity(summary["ledger"])


def test_ray_runtime(tiny_models: dict[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A short Ray run; Ray's core worker has nothing to report at error level on the way (the explorer actors, which
    Ray may restart, take no constructor argument from the object store)."""
    pytest.importorskip("ray")
    from divopd.train import train

    run_dir = tmp_path / "ray"
    cfg = tiny_config(tiny_models, run_dir, "divopd", **{"runtime.kind": "ray", "runtime.ray_num_cpus": 2})
    summary = train(cfg)
    assert summary["updates"] == 3
    assert_ledger_identity(summary["ledger"])
    assert [r["update"] for r in read_metrics(run_dir) if r["kind"] == "update"] == [1, 2, 3]
    err = capfd.readouterr().err
    warned = [line for line in err.splitlines() if "constructor arguments in the object store" in line]
    assert not warned, warned[0]


def _train_in_a_subprocess(cfg: TrainConfig, tmp_path: Path) -> subprocess.Popen:
    """``divopd train`` on ``cfg`` (written to tmp_path/cfg.yaml) as a child process, output discarded."""
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "divopd", "train", str(cfg_path), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


# Slow: by default: test_faults_resume.py::test_sigkill_at_each_phase_then_resume_equals_the_uninterrupted_run
@pytest.mark.slow
def test_kill_and_resume(tiny_models: dict[str, str], tmp_path: Path) -> None:
    """kill -9 mid-run, then --resume: the ledger stays whole, no arrival is logged twice, training continues."""
    run_dir = tmp_path / "killed"
    cfg = tiny_config(tiny_models, run_dir, "divopd", updates=16, **{"checkpoint.every": 2, "eval.every": 100})
    proc = _train_in_a_subprocess(cfg, tmp_path)
    try:
        deadline = time.monotonic() + 600  # generous: the verdict must not depend on machine load
        while time.monotonic() < deadline:
            ckpts = list((run_dir / "checkpoints").glob("update-*")) if (run_dir / "checkpoints").is_dir() else []
            if any(int(p.name.split("-")[1]) >= 4 for p in ckpts):
                break
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint within 600 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = [r for r in read_metrics(run_dir) if r["kind"] == "update"]
    assert before, "the killed run wrote no update"
    from divopd.train import train

    summary = train(resume=run_dir)
    assert summary["resumed"] and summary["updates"] == 16
    assert_ledger_identity(summary["ledger"])
    updates = [r["update"] for r in read_metrics(run_dir) if r["kind"] == "update"]
    assert updates == list(range(1, 17)), "each update recorded exactly once"
    arrivals = [t.arrival for t in read_log(run_dir / "experience")]
    assert arrivals == list(range(summary["ledger"]["received"])), "each received turn logged exactly once"


def test_tcod_step_limit_follows_the_schedule() -> None:
    from divopd.train.runtime.common import step_limit

    cfg = load_config("tiny", ["method=tcod-f2b", "updates=100", "explorer.max_steps=20"])
    limits = [step_limit(cfg, v) for v in range(0, 101, 10)]
    assert limits == [1, 2, 4, 6, 7, 9, 11, 12, 14, 16, 17]  # TCOD: 1 + (updates + 1) // 6 (eta 6)
    assert step_limit(cfg, 200) == 20  # capped by explorer.max_steps
    plain = load_config("tiny", ["method=vanilla", "explorer.max_steps=20"])
    assert {step_limit(plain, v) for v in (0, 50, 100)} == {20}


def test_eval_checkpoint(tiny_models: dict[str, str], tmp_path: Path) -> None:
    from divopd.train import train
    from divopd.train.evaluate import evaluate_checkpoint

    train(tiny_config(tiny_models, tmp_path / "run", "divopd-base", updates=2))
    results = evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "update-000002", tasks=3)
    assert results["eval/episodes"] == 3 and 0 <= results["eval/success_rate"] <= 1
    assert results["eval/policy_version"] == 2.0  # the checkpoint's learner version
    with pytest.raises(FileNotFoundError, match="config"):
        evaluate_checkpoint(tiny_models["student"])


def test_tiny_config_matches_its_models() -> None:
    """The packaged setting tiny must use the environment and prompt its models (recipe "tiny") are SFT-trained with."""
    from divopd.suite.models import RECIPES

    recipe = RECIPES["tiny"]
    cfg = load_config("tiny")
    assert cfg.explorer.env == recipe.env and cfg.explorer.env_kwargs == recipe.env_kwargs
    for key, value in recipe.prompt.items():
        assert getattr(cfg.explorer.prompt, key) == value


# Slow: by default: test_faults_resume.py::test_ctrl_c_then_resume_equals_the_uninterrupted_run, test_interrupt.py
@pytest.mark.slow
def test_ctrl_c_checkpoints_and_exits(tiny_models: dict[str, str], tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) mid-run: the run checkpoints, exits with 130, and --resume finishes it."""
    run_dir = tmp_path / "interrupted"
    # 24 updates: the signal, sent once the first update is written, lands long before the last (each update generates
    # and scores a batch of turns), and the resume below has little left to train
    cfg = tiny_config(tiny_models, run_dir, "divopd-base", updates=24, **{"checkpoint.every": 1000, "eval.every": 1000})
    proc = _train_in_a_subprocess(cfg, tmp_path)
    deadline = time.monotonic() + 600  # generous: the verdict must not depend on machine load
    while not ((run_dir / "metrics.jsonl").is_file() and '"update"' in (run_dir / "metrics.jsonl").read_text()):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"no update written (exit code {proc.poll()})")
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=600) == 130
    ckpts = sorted((run_dir / "checkpoints").glob("update-*"))
    assert ckpts, "Ctrl-C must leave a checkpoint"
    version = int(ckpts[-1].name.split("-")[1])
    assert 0 < version < 24
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == version
    assert_ledger_identity(summary["ledger"])
    from divopd.train import train

    resumed = train(resume=run_dir)
    assert resumed["updates"] == 24 and resumed["resumed"]
    assert_ledger_identity(resumed["ledger"])


@pytest.mark.parametrize(("kwargs", "needle"), [({"num_rooms": 1}, "num_rooms must be >= 2"),
                                                ({"colour": "red"}, "unexpected keyword argument 'colour'")])
def test_bad_env_kwargs_are_one_line_and_exit_2(tiny_models: dict[str, str], tmp_path: Path, kwargs: dict,
                                                needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """explorer.env_kwargs reach the env only when the explorer builds it: still one line and exit 2."""
    from divopd import cli

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd")
    data = cfg.model_dump(mode="json")
    data["explorer"]["env_kwargs"] = kwargs
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["train", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("divopd train: error: environment 'tiny'") and needle in err[0], err


@pytest.mark.parametrize("kind", ["threads", "lockstep", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_run_stopped_by_bad_env_kwargs_leaves_no_run_dir_behind(tiny_models: dict[str, str], tmp_path: Path,
                                                                  kind: str, capsys: pytest.CaptureFixture) -> None:
    """The input error surfaces only once the explorer builds its env, after the run directory was made: it is one
    line and exit 2 under every runtime (under Ray: the actor's error itself, not "every explorer actor has
    failed"), and the fresh run's files go again, so the same command (or the corrected one) is not refused with
    "already holds a run". A directory that existed before keeps only what was in it."""
    from divopd import cli

    if kind == "ray":
        pytest.importorskip("ray")
    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd")
    data = cfg.model_dump(mode="json")
    data["explorer"]["env_kwargs"] = {"num_rooms": 1}
    data["runtime"].update(kind=kind, ray_num_cpus=2)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    for _ in range(1 if kind == "ray" else 2):  # a Ray start costs ~20 s: once is enough there
        assert cli.main(["train", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "num_rooms must be >= 2" in err[0], err
        assert not (tmp_path / "run").exists()
    if kind == "ray":
        return
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert cli.main(["train", str(tmp_path / "cfg.yaml"), "--no-progress"]) == 2
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]


def test_a_ray_explorer_actor_keeps_bad_input_and_the_driver_raises_it(tiny_models: dict[str, str],
                                                                       tmp_path: Path) -> None:
    """The Ray runtime's half of the rule above, without starting Ray (the whole path under Ray is the slow variant
    of the test above): the actor class keeps the input error instead of dying (a restart cannot fix bad input) and
    raises it from every call; raise_input_error re-raises it from a failed call's error, and lets other failures
    through."""
    pytest.importorskip("ray")
    from ray.exceptions import RayTaskError

    from divopd.errors import ConfigError, UsageError
    from divopd.learn.checkpoint import WeightHandle
    from divopd.models import load_model
    from divopd.train.runtime.ray import ExplorerActor, raise_input_error
    from tiny_models import copy_state_dict

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd")
    data = cfg.model_dump(mode="json")
    data["explorer"]["env_kwargs"] = {"num_rooms": 1}
    handle = WeightHandle(0, state_dict=copy_state_dict(load_model(cfg.student.path)[0]))
    actor = ExplorerActor(data, 0, 0, True)  # the env is built at the first collect
    with pytest.raises(ConfigError, match="num_rooms must be >= 2") as bad_env:
        actor.collect(1, handle)
    data["teacher"]["path"] = str(tmp_path / "no-model-here")  # bad input met while the actor is constructed
    actor = ExplorerActor(data, 0, 0, True)
    assert isinstance(actor.input_error, UsageError)
    for call in (lambda: actor.collect(1, handle), lambda: actor.evaluate(handle, 2)):
        with pytest.raises(UsageError, match="no-model-here"):
            call()
    actor.close()  # nothing was built: nothing to close, no error
    with pytest.raises(ConfigError, match="num_rooms must be >= 2"):
        raise_input_error(RayTaskError("collect", "traceback", bad_env.value))
    assert raise_input_error(RayTaskError("collect", "traceback", RuntimeError("env crashed"))) is None


def test_remove_run_files_removes_only_the_named_entries(tmp_path: Path) -> None:
    from divopd.train.rundir import RUN_ENTRIES, remove_run_files

    (tmp_path / "checkpoints" / "update-000001").mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "mine.txt").write_text("keep")
    remove_run_files(tmp_path, ("metrics.jsonl", "summary.json"))  # summary.json is missing: skipped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "mine.txt"]
    remove_run_files(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"] and "checkpoints" in RUN_ENTRIES
