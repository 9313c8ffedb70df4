"""`divopd doctor` and the checks `divopd train` runs before it makes a run directory:
the machine's rows on this machine, exit 0 for a config that runs here, exit 2 with one line per blocker for a config
that needs CUDA, a missing model, a teacher of another vocabulary refused by the config, a teacher server that does
not answer, a JVM environment without Java; and `divopd train` refusing such a config in one line with no run
directory left behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from divopd.cli import main

REPO = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
no_cuda = pytest.mark.skipif(CUDA, reason="this machine has CUDA: the rows under test are the CPU machine's")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny student and teacher, and a teacher of another vocabulary (a BPE tokenizer)."""
    from divopd.models.tiny import build_model, build_tokenizer
    from tiny_models import build_tiny_models

    root = tmp_path_factory.mktemp("doctor-models")
    paths = build_tiny_models(root)
    tok = build_tokenizer(["move east west take coin You are an agent. Valid actions:"], kind="bpe", vocab_size=120)
    build_model(tok, size="0.2m", seed=2).save_pretrained(root / "bpe-teacher")
    tok.save_pretrained(root / "bpe-teacher")
    return {**paths, "bpe": str(root / "bpe-teacher")}


def _config(models: dict[str, str], tmp_path: Path, **over: object) -> Path:
    data = {"setting": "doctor", "method": "divopd", "updates": 3, "run_dir": str(tmp_path / "run"),
            "student": {"path": models["student"]}, "teacher": {"path": models["teacher"]},
            "sampler": {"batch_size": 6, "pool_factor": 4, "cap": 2, "max_staleness": 2},
            "explorer": {"env": "tiny", "num_envs": 3, "max_steps": 5, "eval_tasks": 3},
            "eval": {"every": 3, "tasks": 3, "at_start": False}, "runtime": {"kind": "lockstep"}}
    data.update(over)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict], list[str]]:
    code = main(["doctor", "--json", "--import-timeout", "0", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], [line for line in err.splitlines() if line]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_doctor_without_a_config_lists_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, err = _doctor(capsys)
    assert code == 0 and err == []
    by = {r["name"]: r for r in rows}
    assert {"python", "divopd", "torch", "cuda", "bf16 (cuda)", "nccl", "gloo", "vllm", "ray", "java",
            "disk"} <= set(by)
    assert all(r["section"] == "machine" and r["status"] in ("ok", "not available") for r in rows)
    assert by["torch"]["detail"].startswith(torch.__version__)
    if not CUDA:  # this machine: a CPU-only torch
        assert by["cuda"]["status"] == by["bf16 (cuda)"]["status"] == "not available"
        assert "torch" in by["cuda"]["fix"]


def test_the_table_names_each_row_and_its_fix() -> None:
    out = subprocess.run([sys.executable, "-m", "divopd", "doctor", "--import-timeout", "0"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=False)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.startswith("this machine:") and "\n  gloo " in out.stdout
    if not CUDA:
        assert "  cuda " in out.stdout and "not available" in out.stdout and "->  install a CUDA build" in out.stdout


def test_a_config_that_runs_here_exits_0(models: dict[str, str], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, err = _doctor(capsys, str(_config(models, tmp_path)))
    assert code == 0 and err == []
    config = {r["name"]: r for r in rows if r["section"] == "config"}
    assert config["student.path"]["status"] == config["teacher.path"]["status"] == "ok"
    assert "tokenizer" in config["student.path"]["detail"]
    assert config["vocabulary"]["status"] == "ok" and config["disk"]["status"] == "ok"
    assert config["teacher server"]["status"] == "not needed"
    assert not any(r["blocker"] for r in rows)
    assert not (tmp_path / "run").exists()


@no_cuda
def test_a_config_that_needs_cuda_is_one_line_per_blocker(models: dict[str, str], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = str(_config(models, tmp_path))
    code, rows, err = _doctor(capsys, config, "--set", "student.device=cuda", "--set", "learner.device=cuda:1")
    assert code == 2 and len(err) == 2
    assert err[0] == (f"divopd doctor: error: learner.device: cuda:1 needs CUDA, but torch {torch.__version__} is a "
                      "CPU-only build; set learner.device: cpu or install a CUDA build of torch "
                      "(https://pytorch.org/get-started/locally/)")
    assert err[1].startswith("divopd doctor: error: student.device: cuda needs CUDA")
    assert {r["name"] for r in rows if r["status"] == "missing"} == {"learner.device", "student.device"}


def test_a_missing_model_folder(models: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-model"
    code, rows, err = _doctor(capsys, str(_config(models, tmp_path)), "--set", f"teacher.path={missing}")
    assert code == 2
    assert err == [f"divopd doctor: error: teacher.path: {missing} is not a model folder (no such folder)"]
    assert next(r for r in rows if r["name"] == "vocabulary")["status"] == "skipped"


def test_a_hub_model_not_in_the_cache_offline_is_one_row_that_says_how_to_get_it(
        models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    hub = "fnlp/Embodied_R1-ScienceWorld"
    code, rows, err = _doctor(capsys, str(_config(models, tmp_path)), "--set", f"teacher.path={hub}")
    assert code == 2 and len(err) == 1 and err[0].endswith(f"download it once with the network on: `hf download {hub}`")
    (row,) = [r for r in rows if r["name"] == "teacher.path"]
    assert row["status"] == "missing" and row["detail"] == f"{hub}: a hub model not in the local cache (offline)"
    assert row["fix"].startswith(f"download it once with the network on: `hf download {hub}`")


def test_the_packaged_paper_settings_name_hub_models_the_doctor_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """No placeholder in a packaged setting: every model path is a hub id or a folder a recipe builds under cache/;
    offline with an empty hub cache, `divopd doctor scienceworld` lists its two hub models as missing rows saying how
    to get them, and no traceback."""
    import re

    from divopd.train.config import load_config
    from divopd.train.packaged import setting_names

    hub_id = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
    for name in setting_names():
        cfg = load_config(name)
        for path in (cfg.student.path, cfg.teacher.path):
            assert hub_id.match(path) or path.startswith("cache/"), (name, path)
        text = (REPO / "src" / "divopd" / "configs" / f"{name}.yaml").read_text()
        assert not re.search(r"path/to|<[a-z_ -]+>|\bTODO\b|\.\.\./", text), name
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    code, rows, err = _doctor(capsys, "scienceworld", "--set", f"run_dir={tmp_path / 'run'}")
    assert code == 2 and not any("Traceback" in line for line in err)
    by = {r["name"]: r for r in rows if r["section"] != "machine"}
    for key, hub in (("student.path", "Qwen/Qwen2.5-1.5B-Instruct"), ("teacher.path", "fnlp/Embodied_R1-ScienceWorld")):
        assert by[key]["status"] == "missing" and f"`hf download {hub}`" in by[key]["fix"], by[key]


def test_train_states_the_rows_flagged_stated(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """`divopd train` logs the detail of each passing row flagged ``stated`` (the teacher server's: which model it
    serves), chosen by that flag, not by a row's name."""
    import logging

    from divopd.train import preflight
    from divopd.train.probes import MISSING, OK, Check

    rows = [Check("served model", OK, "serves teacher (tokenizer matches)", stated=True),
            Check("teacher server", OK, "a row without the flag"),
            Check("flagged but not ok", MISSING, "not stated either", blocker="a blocker", stated=True)]
    monkeypatch.setattr(preflight, "config_checks", lambda cfg, run_dir=None: rows[:2])
    with caplog.at_level(logging.INFO, logger="divopd.train.preflight"):
        preflight.check_before_run(None)  # type: ignore[arg-type]
    assert "serves teacher (tokenizer matches)" in caplog.text and "without the flag" not in caplog.text
    monkeypatch.setattr(preflight, "config_checks", lambda cfg, run_dir=None: rows[2:])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="divopd.train.preflight"), pytest.raises(preflight.PreflightError):
        preflight.check_before_run(None)  # type: ignore[arg-type]
    assert "not stated either" not in caplog.text
    assert all("stated" not in row.as_dict() for row in rows)  # `divopd doctor --json` rows keep their keys


def test_a_teacher_of_another_vocabulary_refused_by_the_config(models: dict[str, str], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = str(_config(models, tmp_path))
    code, rows, err = _doctor(capsys, config, "--set", f"teacher.path={models['bpe']}")
    assert code == 0 and next(r for r in rows if r["name"] == "vocabulary")["detail"].startswith("cross")
    code, rows, err = _doctor(capsys, config, "--set", f"teacher.path={models['bpe']}",
                              "--set", "teacher.cross_tokenizer=false")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"divopd doctor: error: teacher.path: {models['bpe']} has a different vocabulary")
    assert "teacher.cross_tokenizer is false" in err[0]


def test_a_teacher_server_that_does_not_answer(models: dict[str, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    port = _closed_port()
    code, rows, err = _doctor(capsys, str(_config(models, tmp_path)), "--set", "teacher.backend=server",
                              "--set", f"teacher.server.url=http://127.0.0.1:{port}",
                              "--set", "teacher.server.timeout_s=5")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"divopd doctor: error: teacher.server.url: teacher server http://127.0.0.1:{port}")
    assert err[0].endswith("start the teacher server first (concepts/teacher.md)")
    assert next(r for r in rows if r["name"] == "teacher server")["status"] == "missing"


def test_a_jvm_environment_without_java(models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("textworld_express")
    config = _config(models, tmp_path, explorer={"env": "twx", "num_envs": 1, "max_steps": 5})
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no java
    code, rows, err = _doctor(capsys, str(config))
    assert code == 2
    assert err == ["divopd doctor: error: explorer.env: twx runs on a Java VM, but no `java` on PATH; install a Java "
                   "17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`) and put `java` on PATH"]
    machine_java = next(r for r in rows if r["name"] == "java" and r["section"] == "machine")
    assert machine_java["status"] == "not available"


def test_doctor_input_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--set", "student.device=cuda"]) == 2
    assert capsys.readouterr().err.strip() == ("divopd doctor: error: --method, --set and --run-dir need a CONFIG "
                                               "(a packaged setting's name or a YAML file)")
    assert main(["doctor", "no-such-setting"]) == 2
    assert "no-such-setting" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- divopd train, same checks
@no_cuda
def test_train_on_cuda_without_cuda_is_one_line_and_no_run_directory(models: dict[str, str], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(models, tmp_path)
    capsys.readouterr()
    code = main(["train", str(config), "--no-progress", "--set", "student.device=cuda"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip() and " INFO " not in line]
    assert lines == [f"divopd train: error: student.device: cuda needs CUDA, but torch {torch.__version__} is a "
                     "CPU-only build; set student.device: cpu or install a CUDA build of torch "
                     "(https://pytorch.org/get-started/locally/)"]
    assert not (tmp_path / "run").exists()


def test_train_refuses_each_blocker_before_the_run_directory(models: dict[str, str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = str(_config(models, tmp_path))
    port = _closed_port()
    cases = [
        (["--set", f"teacher.path={models['bpe']}", "--set", "teacher.cross_tokenizer=false"],
         "teacher.cross_tokenizer is false"),
        (["--set", "teacher.backend=server", "--set", f"teacher.server.url=http://127.0.0.1:{port}"],
         "start the teacher server first"),
        (["--set", "runtime.kind=ray", "--set", f"runtime.ray_address=127.0.0.1:{port}"],
         f"runtime.ray_address: 127.0.0.1:{port}: the cluster does not answer"),
    ]
    if not CUDA:
        cases.append((["--set", "learner.device=cuda", "--set", "teacher.device=cuda"],
                      "learner.device: cuda needs CUDA, but torch"))
    for args, message in cases:
        assert main(["train", config, "--no-progress", *args]) == 2, args
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("divopd train")]
        assert len(err) == 1 and message in err[0], (args, err)
        assert not (tmp_path / "run").exists(), args
    if not CUDA:  # two blockers: the first, and how many more the doctor lists
        assert "(and 1 more: `divopd doctor CONFIG` lists them)" in err[0]


def test_train_refuses_a_run_directory_without_the_free_space(models: dict[str, str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from divopd.train import preflight

    monkeypatch.setattr(preflight, "disk_free", lambda path: (Path(path).parent, 1024))
    assert main(["train", str(_config(models, tmp_path)), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"divopd train: error: run directory {tmp_path / 'run'}: 0.00 GiB free on its filesystem" in err
    assert "free space or choose another --run-dir" in err
    assert not (tmp_path / "run").exists()


def test_a_packaged_setting_on_a_fresh_folder_checks_its_shipped_models(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`divopd train coin6-dart` copies the package's prebuilt models into ./cache on first use, so the doctor of a
    fresh folder checks those (exit 0), says where they will go and copies nothing; a folder divopd did not write
    there is what the run would read, and the doctor checks that one."""
    monkeypatch.chdir(tmp_path)
    code, rows, err = _doctor(capsys, "coin6-dart")
    config = {r["name"]: r for r in rows if r["section"] == "config"}
    assert code == 0 and err == [], err
    for name in ("student", "teacher"):
        assert config[f"{name}.path"]["status"] == "ok"
        assert config[f"{name}.path"]["detail"].endswith(f"copied to cache/coin6-dart/{name} on the first divopd train")
    assert config["vocabulary"]["status"] == "ok"
    assert not (tmp_path / "cache").exists()
    (tmp_path / "cache" / "coin6-dart" / "teacher").mkdir(parents=True)  # not divopd's: never replaced
    code, rows, err = _doctor(capsys, "coin6-dart")
    assert code == 2 and err == ["divopd doctor: error: teacher.path: cache/coin6-dart/teacher is not a model folder "
                                 "(no config.json); build it with `python -m divopd.suite.demo --configs "
                                 "coin6-dart`"], err
