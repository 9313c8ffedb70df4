"""The CLI as a user meets it, driven as a user drives it: the real ``divopd`` in a subprocess where it matters (a
terminal Ctrl-C to the process group, a finished run resumed, a typo in ``--set``), in-process where a subprocess adds
nothing. Each message is what a user reads: the key and where it was written, the command to type next."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from divopd import cli
from divopd.train.config import load_config
from divopd.train.config_load import closest_key
from test_train import tiny_config, tiny_models  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    """This interpreter's environment with this checkout's divopd first on the path."""
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra}


def _divopd(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "divopd", *argv], capture_output=True, text=True, env=_env(),
                          timeout=timeout)


# ---------------------------------------------------------------------------------------------------- config keys
def test_a_typo_in_set_is_named_against_the_command_line_with_the_closest_key() -> None:
    out = _divopd("train", "tiny", "--set", "sampler.kap=3")
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["divopd train: error: --set sampler.kap=3: unknown key sampler.kap; did you "
                                       "mean `sampler.cap`?"]  # not the packaged file's path: it is not broken


def test_a_typo_in_a_yaml_file_is_named_against_that_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"learner": {"lr": 1e-3, "gard_clip": 1.0}}))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "setting": "s", "method": "divopd"}))
    assert cli.main(["train", str(tmp_path / "run.yaml")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"divopd train: error: {tmp_path / 'base.yaml'}: unknown key "
                                                    "learner.gard_clip; did you mean `learner.grad_clip`?"]


@pytest.mark.parametrize(("typo", "meant"), [("samplr.cap", "sampler.cap"), ("sampler.lr", "learner.lr"),
                                             ("explorer.generaton.max_new_tokens",
                                              "explorer.generation.max_new_tokens"), ("xyzzy", None)])
def test_the_closest_key(typo: str, meant: str | None) -> None:
    from divopd.train.config import TrainConfig

    assert closest_key(TrainConfig, typo) == meant


def test_free_form_mappings_take_any_key_and_a_bad_value_names_its_set() -> None:
    cfg = load_config("tiny", ["explorer.env_kwargs.anything=1"])
    assert cfg.explorer.env_kwargs["anything"] == 1
    with pytest.raises(ValueError, match=r"^--set sampler.cap=abc: sampler.cap: Input should be a valid integer"):
        load_config("tiny", ["sampler.cap=abc"])


# ---------------------------------------------------------------------------------------------------- report
def _fake_run(path: Path, seed: int, updates: int, lr: float) -> None:
    """A finished run directory as divopd writes it: config.yaml, metrics.jsonl (evals), summary.json."""
    path.mkdir(parents=True)
    config = {"setting": "guess", "method": "divopd", "seed": seed, "updates": updates, "run_dir": str(path),
              "learner": {"lr": lr, "world_size": 1}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    evals = [{"kind": "eval", "update": u, "eval/success_rate": min(1.0, u / 100), "learner/tokens_total": 10.0 * u,
              "learner/compute_s_total": float(u)} for u in range(0, updates + 1, 5)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (path / "summary.json").write_text(json.dumps({"updates": updates}))


def test_report_refuses_to_pool_unlike_runs_unless_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 10-update run and a 60-update run with another learning rate are not two seeds of one method."""
    runs = tmp_path / "runs" / "guess"
    _fake_run(runs / "short", seed=0, updates=10, lr=1e-3)
    _fake_run(runs / "long", seed=1, updates=60, lr=5e-4)
    out = _divopd("report", str(runs), "--baseline", "vanilla", "--no-plots", "--out", str(tmp_path / "rep"))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    line = out.stderr.strip()
    assert line.startswith("divopd report: error: setting 'guess', method 'divopd': the runs differ in more than "
                           "the seed: learner.lr, updates (")
    assert str(runs / "short") in line and str(runs / "long") in line and "--group-anyway" in line
    assert not (tmp_path / "rep").exists()

    assert cli.main(["report", str(runs), "--no-plots", "--out", str(tmp_path / "rep"), "--group-anyway"]) == 0
    note = "guess/divopd: pooled as seeds (--group-anyway), though the runs differ in learner.lr, updates"
    assert note in capsys.readouterr().out
    assert note in (tmp_path / "rep" / "report.md").read_text()


def test_report_pools_runs_that_differ_only_in_seed_and_placement(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _fake_run(tmp_path / "a", seed=0, updates=10, lr=1e-3)
    _fake_run(tmp_path / "b", seed=1, updates=10, lr=1e-3)
    config = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    config["learner"]["world_size"] = 2  # where it ran, not what it computed
    (tmp_path / "b" / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["report", str(tmp_path), "--no-plots", "--out", str(tmp_path / "rep")]) == 0
    assert "pooled" not in capsys.readouterr().out
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert len(rep["settings"]["guess"]["methods"]["divopd"]["seeds"]) == 2


# ---------------------------------------------------------------------------------------------------- train
@pytest.fixture(scope="module")
def finished_run(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    from divopd.train import train

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(tiny_config(tiny_models, run_dir, "divopd", updates=2))
    return run_dir


def test_resuming_a_finished_run_says_so_and_trains_nothing(finished_run: Path) -> None:
    before = {p.name: p.read_bytes() for p in (finished_run / "summary.json", finished_run / "metrics.jsonl")}
    out = _divopd("train", "--resume", str(finished_run))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"divopd train: {finished_run} is finished (2 of 2 updates); nothing to "
                                       f"resume (its summary: {finished_run / 'summary.json'})"]  # no second summary
    assert {p.name: p.read_bytes() for p in (finished_run / "summary.json", finished_run / "metrics.jsonl")} == before


def test_doctor_checks_the_run_directory_as_train_claims_it(finished_run: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "again.yaml"
    config.write_text((finished_run / "config.yaml").read_text())  # the same run directory
    assert cli.main(["doctor", str(config), "--import-timeout", "0"]) == 2
    out, err = capsys.readouterr()
    refusal = (f"{finished_run} already holds a run; pass --resume {finished_run} to continue it, or choose another "
               "seed or --run-dir")
    assert "this config can run here" not in out
    assert err.splitlines() == [f"divopd doctor: error: {refusal}"]
    assert cli.main(["train", str(config), "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"divopd train: error: {refusal}"  # what train then says


def test_doctor_names_the_command_that_builds_a_settings_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # a fresh clone: no cache/demo
    assert cli.main(["doctor", "tiny", "--import-timeout", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"divopd doctor: error: {key}.path: cache/demo/{key} is not a model folder (no such folder); "
                   "build it with `python -m divopd.suite.demo --configs tiny`" for key in ("student", "teacher")]


def _read_all(fd: int, into: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal's other end closed
            return
        if not chunk:
            return
        into += chunk


def test_ctrl_c_in_a_terminal_ends_with_the_resume_command(tiny_models: dict[str, str],  # noqa: F811
                                                           tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the whole process group: the warning starts a line of its own above the progress
    bar, and the last line is the command that continues the run."""
    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_models, run_dir, "divopd", updates=500, **{"checkpoint.every": 1000, "eval.every": 1000})
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "divopd", "train", str(config)], stdin=slave, stdout=slave,
                            stderr=slave, env=_env(COLUMNS="400"), start_new_session=True)
    os.close(slave)
    seen = bytearray()
    reader = threading.Thread(target=_read_all, args=(master, seen), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while b" 1/500" not in seen and b" 2/500" not in seen:  # the bar shows an update
            assert proc.poll() is None and time.monotonic() < deadline, seen.decode(errors="replace")[-2000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=600) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=30)
    os.close(master)
    lines = [line.split("\r")[-1].replace("\x1b[2K", "") for line in seen.decode(errors="replace").splitlines()]
    warning = next(line for line in lines if "SIGINT received" in line)
    assert "/500" not in warning and warning.split()[2] == "divopd.train.interrupt", warning  # a line of its own
    assert [line for line in lines if line.strip()][-1] == f"divopd train --resume {run_dir}"
    assert (run_dir / "checkpoints").is_dir()


# ---------------------------------------------------------------------------------------------------- progress bars
_BARS = ("from divopd import cli\ncli.quiet_third_party_loggers({verbose})\nimport tqdm\n"
         "from transformers.utils import logging\n"
         "print(logging.is_progress_bar_enabled(), tqdm.tqdm(range(1)).disable)")


@pytest.mark.parametrize(("verbose", "shown"), [(False, "False True"), (True, "True False")])
def test_third_party_progress_bars_are_off_unless_verbose(verbose: bool, shown: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in cli.QUIET_PROGRESS_ENV}
    out = subprocess.run([sys.executable, "-c", _BARS.format(verbose=verbose)], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.split("\n")[0] == shown


@pytest.mark.slow
def test_eval_shows_no_weight_loading_bar_unless_verbose(finished_run: Path) -> None:
    ckpt = finished_run / "checkpoints" / "update-000002"
    quiet = _divopd("eval", str(ckpt), "--tasks", "1")
    verbose = _divopd("eval", str(ckpt), "--tasks", "1", "--verbose")
    assert quiet.returncode == verbose.returncode == 0
    assert "Loading weights" not in quiet.stderr and "Loading weights" in verbose.stderr
