"""Bad input to any `divopd` command is one line on stderr naming what is wrong, exit 2, no traceback.

The table runs most cases in-process through :func:`divopd.cli.main` (cheap); the ones marked ``SUB`` run the real
CLI in a subprocess (``python -m divopd``) to prove no traceback reaches stderr for real. Also: ``--debug`` /
``DIVOPD_DEBUG=1`` show the traceback, a bug keeps its traceback, and third-party INFO logs (py4j's "Callback Server
Starting" of every TextWorld-Express JVM) are quiet unless ``--verbose``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from divopd import cli
from divopd.errors import UsageError, check_model_folder, describe_validation_error, one_line
from divopd.suite.plan import DEFAULT_PLAN

SUB = "subprocess"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of good and bad inputs; the table's ``{d}`` is this folder."""
    d = tmp_path_factory.mktemp("inputs")
    for name in ("student", "teacher"):  # enough to pass the early model-folder check (nothing is loaded)
        (d / name).mkdir()
        (d / name / "config.json").write_text("{}")
    (d / "emptydir").mkdir()
    good = {
        "setting": "cli-errors", "method": "divopd", "updates": 2, "run_dir": str(d / "run"),
        "student": {"path": str(d / "student")}, "teacher": {"path": str(d / "teacher")},
        "sampler": {"batch_size": 4}, "explorer": {"env": "tiny", "num_envs": 2, "max_steps": 3},
    }
    (d / "good.yaml").write_text(yaml.safe_dump(good))
    (d / "empty.yaml").write_text("")
    (d / "syntax.yaml").write_text("setting: x\nmethod: [divopd\n")
    (d / "unknown_key.yaml").write_text(yaml.safe_dump({**good, "sampler": {"batch_size": 4, "kap": 3}}))
    (d / "wrong_type.yaml").write_text(yaml.safe_dump({**good, "updates": "many"}))
    # experience logs that are not logs
    pq.write_table(pa.table({"foo": [1, 2]}), d / "columns.parquet")
    (d / "text.parquet").write_text("not parquet\n")
    # run directories for report
    (d / "runs" / "noseed").mkdir(parents=True)
    (d / "runs" / "noseed" / "config.yaml").write_text("method: vanilla\nsetting: s\n")
    (d / "runs" / "badmetrics").mkdir()
    (d / "runs" / "badmetrics" / "config.yaml").write_text("method: vanilla\nsetting: s\nseed: 0\n")
    (d / "runs" / "badmetrics" / "metrics.jsonl").write_text('{"kind": "update", "update": 1\n{}\n')
    # checkpoints for eval: a model folder with no config.yaml beside it
    (d / "ckpt").mkdir()
    (d / "ckpt" / "config.json").write_text("{}")
    # bench plans
    (d / "plan_syntax.yaml").write_text("out: runs\nseeds: [0, 1\n")
    plan = yaml.safe_load(DEFAULT_PLAN.read_text())
    (d / "plan_typo.yaml").write_text(yaml.safe_dump({**plan, "typo": 1}))
    (d / "plan_empty.yaml").write_text("\n")
    return d


# (case id, argv with {d} = the inputs folder, text the error line must hold, how to run)
CASES: list[tuple[str, list[str], str, str]] = [
    # train
    ("train-missing-config", ["train", "{d}/nope.yaml"], "nope.yaml", SUB),
    ("train-config-is-a-dir", ["train", "{d}/emptydir"], "emptydir", ""),
    ("train-empty-config", ["train", "{d}/empty.yaml"], "empty.yaml", ""),
    ("train-yaml-syntax", ["train", "{d}/syntax.yaml"], "syntax.yaml: YAML syntax error at line", ""),
    ("train-unknown-key-file", ["train", "{d}/unknown_key.yaml"], "sampler.kap", ""),
    ("train-unknown-key-set", ["train", "{d}/good.yaml", "--set", "sampler.bogus=1"], "sampler.bogus", SUB),
    ("train-wrong-type-file", ["train", "{d}/wrong_type.yaml"], "updates: Input should be a valid integer", ""),
    ("train-wrong-type-set", ["train", "{d}/good.yaml", "--set", "sampler.batch_size=abc"], "sampler.batch_size",
     ""),
    ("train-out-of-range", ["train", "{d}/good.yaml", "--set", "sampler.batch_size=0"],
     "sampler.batch_size: Input should be greater than or equal to 1", ""),
    ("train-unknown-method", ["train", "{d}/good.yaml", "--set", "method=fancy"], "method: unknown method 'fancy'",
     ""),
    ("train-unknown-env", ["train", "{d}/good.yaml", "--set", "explorer.env=nowhere"],
     "explorer.env: unknown environment 'nowhere'", ""),
    ("train-bad-split", ["train", "{d}/good.yaml", "--set", "explorer.eval_split=val"], "explorer.eval_split", ""),
    ("train-set-without-equals", ["train", "{d}/good.yaml", "--set", "sampler.cap"], "KEY=VALUE", ""),
    ("train-set-bad-yaml", ["train", "{d}/good.yaml", "--set", "sampler.cap=[1"], "--set sampler.cap", ""),
    ("train-student-path", ["train", "{d}/good.yaml", "--set", "student.path=/no/such/folder"],
     "student.path: /no/such/folder is not a model folder", SUB),
    ("train-teacher-path", ["train", "{d}/good.yaml", "--set", "teacher.path={d}/emptydir"],
     "teacher.path: {d}/emptydir is not a model folder (no config.json)", ""),
    ("train-teacher-hub-name-offline", ["train", "{d}/good.yaml", "--set", "teacher.path=no-org/no-model-xyz"],
     "teacher.path: no-org/no-model-xyz", ""),
    ("train-resume-missing", ["train", "--resume", "{d}/no-run"], "--resume {d}/no-run: no such run directory", ""),
    ("train-resume-not-a-run", ["train", "--resume", "{d}/emptydir"], "not a divopd run directory (no config.yaml)",
     SUB),
    ("train-config-and-resume", ["train", "{d}/good.yaml", "--resume", "{d}/emptydir"], "not both", ""),
    ("train-no-config", ["train"], "CONFIG", ""),
    # eval
    ("eval-missing-checkpoint", ["eval", "{d}/no-ckpt"], "checkpoint: no checkpoint folder at {d}/no-ckpt", ""),
    ("eval-not-a-model-folder", ["eval", "{d}/emptydir"], "checkpoint: {d}/emptydir is not a checkpoint", SUB),
    ("eval-no-config-beside", ["eval", "{d}/ckpt"], "no config.yaml found beside {d}/ckpt", ""),
    ("eval-bad-config", ["eval", "{d}/ckpt", "--config", "{d}/syntax.yaml"], "syntax.yaml", ""),
    ("eval-bad-tasks", ["eval", "{d}/ckpt", "--config", "{d}/good.yaml", "--tasks", "0"], "--tasks", ""),
    # export
    ("export-missing-checkpoint", ["export", "{d}/no-ckpt", "--out", "{d}/exported"],
     "checkpoint: no checkpoint folder at {d}/no-ckpt", ""),
    ("export-out-exists", ["export", "{d}/ckpt", "--out", "{d}/student"], "--out: {d}/student already exists", ""),
    # report
    ("report-not-a-run-dir", ["report", "{d}/emptydir", "--out", "{d}/rep"], "not a run directory", SUB),
    ("report-missing-dir", ["report", "{d}/no-runs", "--out", "{d}/rep"], "{d}/no-runs: not a directory", ""),
    ("report-config-missing-key", ["report", "{d}/runs/noseed", "--out", "{d}/rep"], "missing top-level key 'seed'",
     ""),
    ("report-malformed-metrics", ["report", "{d}/runs/badmetrics", "--out", "{d}/rep"], "metrics.jsonl:1", ""),
    ("report-bad-target", ["report", "{d}/runs/badmetrics", "--target", "lots"], "--target", ""),
    ("report-negative-budget", ["report", "{d}/runs/badmetrics", "--budget", "-1"], "--budget", ""),
    # sft
    ("sft-unknown-env", ["sft", "--out", "{d}/sft", "--env", "nowhere"], "--env: unknown environment", ""),
    ("sft-bad-env-kwargs", ["sft", "--out", "{d}/sft", "--env", "tiny", "--env-kwargs", "{oops"], "--env-kwargs",
     ""),
    ("sft-prompt-unknown-key", ["sft", "--out", "{d}/sft", "--env", "tiny", "--prompt", '{"max_tokens": 5}'],
     "--prompt: max_tokens", ""),
    ("sft-bad-size", ["sft", "--out", "{d}/sft", "--env", "tiny", "--size", "3m"], "--size", ""),
    ("sft-explore-expert-off-coin", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert", "explore"],
     "--expert explore: only for TextWorld-Express coin", ""),
    ("sft-expert-noise-gold", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert-noise", "0.2"],
     "--expert-noise: only with --expert explore", ""),
    ("sft-expert-noise-range", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert-noise", "1.5"],
     "--expert-noise must be in [0, 1)", ""),
    ("sft-expert-epsilon-gold", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert-epsilon", "0.5"],
     "--expert-epsilon: only with --expert explore on TextWorld-Express coin", ""),
    ("sft-expert-epsilon-range", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert-epsilon", "-0.1"],
     "--expert-epsilon must be in [0, 1]", ""),
    ("sft-expert-miss-gold", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert-miss", "0.5"],
     "--expert-miss: only with --expert explore on TextWorld-Express coin", ""),
    ("sft-expert-miss-range", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert-miss", "1.5"],
     "--expert-miss must be in [0, 1]", ""),
    ("sft-expert-zero-steps", ["sft", "--out", "{d}/sft", "--env", "tiny", "--expert-max-steps", "0"],
     "--expert-max-steps must be at least 1", ""),
    ("sft-zero-epochs", ["sft", "--out", "{d}/sft", "--env", "tiny", "--epochs", "0"], "--epochs", ""),
    ("sft-init-not-a-model", ["sft", "--out", "{d}/sft", "--env", "tiny", "--init", "{d}/emptydir"], "--init", ""),
    ("sft-no-out", ["sft", "--env", "tiny"], "--out", ""),
    ("sft-bad-int", ["sft", "--out", "{d}/sft", "--epochs", "two"], "--epochs", ""),
    # simulate
    ("simulate-bad-preset", ["simulate", "--preset", "mars", "--out", "{d}/sim.parquet"], "--preset", ""),
    ("simulate-bad-success-rate", ["simulate", "--out", "{d}/sim.parquet", "--success-rate", "2"],
     "--success-rate", ""),
    ("simulate-zero-updates", ["simulate", "--out", "{d}/sim.parquet", "--updates", "0"], "--updates", ""),
    ("simulate-out-exists", ["simulate", "--out", "{d}/columns.parquet"], "--force", ""),
    # replay
    ("replay-missing-log", ["replay", "{d}/no-log"], "{d}/no-log: no such experience log", ""),
    ("replay-dir-not-a-log", ["replay", "{d}/emptydir"], "no part-*.parquet files", ""),
    ("replay-wrong-columns", ["replay", "{d}/columns.parquet"], "columns.parquet: missing required column", SUB),
    ("replay-not-parquet", ["replay", "{d}/text.parquet"], "text.parquet: not a readable Parquet file", ""),
    ("replay-unknown-method", ["replay", "{d}/columns.parquet", "--methods", "vanilla,bogus"],
     "unknown method 'bogus'", ""),
    # tune-cap
    ("tune-cap-missing-log", ["tune-cap", "{d}/no-log"], "{d}/no-log: no such experience log", ""),
    ("tune-cap-dir-not-a-log", ["tune-cap", "{d}/emptydir"], "no part-*.parquet files", ""),
    ("tune-cap-wrong-columns", ["tune-cap", "{d}/columns.parquet"], "missing required column", ""),
    ("tune-cap-bad-caps", ["tune-cap", "{d}/columns.parquet", "--caps", "2,x"], "--caps", ""),
    ("tune-cap-capless-method", ["tune-cap", "{d}/columns.parquet", "--method", "vanilla"], "vanilla", ""),
    # doctor
    ("doctor-set-without-config", ["doctor", "--set", "student.device=cuda"], "need a CONFIG", ""),
    ("doctor-missing-config", ["doctor", "{d}/no-such.yaml"], "no such config file", ""),
    ("doctor-bad-import-timeout", ["doctor", "--import-timeout", "-1"], "--import-timeout", ""),
    # tasks
    ("tasks-bad-limit", ["tasks", "tiny", "--for", "trinity", "--split", "train", "--out", "{d}/t.jsonl", "--limit",
                         "0"], "--limit must be >= 1", ""),
    ("tasks-out-parent-is-a-file", ["tasks", "tiny", "--for", "trinity", "--split", "train", "--out",
                                    "{d}/text.parquet/t.jsonl"], "is not a directory", ""),
    ("tasks-alfworld-not-set-up", ["tasks", "alfworld", "--for", "trinity", "--split", "train", "--out",
                                   "{d}/alfworld/t.jsonl"], "pip install 'divopd[alfworld]'", ""),
    ("tasks-missing-config", ["tasks", "{d}/no-such.yaml", "--for", "trinity", "--split", "train", "--out",
                              "{d}/t.parquet"], "no such config file", ""),
    # bench
    ("bench-malformed-plan", ["bench", "paper", "--plan", "{d}/plan_syntax.yaml", "--dry-run"],
     "plan_syntax.yaml: YAML syntax error at", SUB),
    ("bench-plan-unknown-key", ["bench", "paper", "--plan", "{d}/plan_typo.yaml", "--dry-run"], "typo", ""),
    ("bench-empty-plan", ["bench", "paper", "--plan", "{d}/plan_empty.yaml", "--dry-run"], "plan_empty.yaml", ""),
    ("bench-missing-plan", ["bench", "paper", "--plan", "{d}/no-plan.yaml"], "no such plan file", ""),
    ("bench-plan-is-a-dir", ["bench", "paper", "--plan", "{d}/emptydir"], "emptydir", ""),
    ("bench-only-matches-nothing", ["bench", "paper", "--only", "nope/*", "--dry-run"], "--only", ""),
    ("bench-seeds-match-nothing", ["bench", "paper", "--seeds", "99", "--dry-run"], "--seeds 99", ""),
    ("bench-unknown-suite", ["bench", "mars"], "suite", ""),
]


def _fill(items: list[str], d: Path) -> list[str]:
    return [s.replace("{d}", str(d)) for s in items]


def _check(verb: str, rc: int, err: str, needle: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"divopd {verb}: error: "), lines[0]
    assert needle in lines[0], lines[0]


def test_every_command_has_cases() -> None:
    verbs = [argv[0] for _, argv, _, _ in CASES]
    assert len(CASES) >= 24
    for verb in cli.COMMANDS:
        assert verbs.count(verb) >= 2, verb
    assert sum(how == SUB for *_, how in CASES) >= 4


@pytest.mark.parametrize(("argv", "needle", "how"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(inputs: Path, argv: list[str], needle: str, how: str,
                                          capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    argv, needle = _fill(argv, inputs), needle.replace("{d}", str(inputs))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DIVOPD_DEBUG", raising=False)
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # the ALFWorld case: its setup is missing
    if how == SUB:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        out = subprocess.run([sys.executable, "-m", "divopd", *argv], capture_output=True, text=True, env=env,
                             cwd=inputs, timeout=120)
        rc, err = out.returncode, out.stderr
    else:
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code
        err = capsys.readouterr().err
    _check(argv[0], rc, err, needle)


# ------------------------------------------------------------------------------------------- debug and bugs
@pytest.mark.parametrize("where", ["before", "after", "env"])
def test_debug_shows_the_traceback(inputs: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["replay", str(inputs / "no-log")]
    monkeypatch.delenv("DIVOPD_DEBUG", raising=False)
    if where == "before":
        argv = ["--debug", *argv]
    elif where == "after":
        argv = [*argv, "--debug"]
    else:
        monkeypatch.setenv("DIVOPD_DEBUG", "1")
    with pytest.raises(UsageError, match="no such experience log"):
        cli.main(argv)


def test_debug_traceback_reaches_stderr(inputs: Path) -> None:
    env = {**os.environ, "DIVOPD_DEBUG": "1"}
    out = subprocess.run([sys.executable, "-m", "divopd", "replay", str(inputs / "columns.parquet")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1 and "Traceback" in out.stderr and "missing required column" in out.stderr


def test_a_bug_keeps_its_traceback(inputs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import divopd.analysis.replay

    def broken(args: object) -> int:
        raise RuntimeError("a bug, not bad input")

    monkeypatch.setattr(divopd.analysis.replay, "run", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["replay", str(inputs / "columns.parquet")])
    monkeypatch.setattr(divopd.analysis.replay, "run", lambda args: int({}["missing"]))  # KeyError: a bug
    with pytest.raises(KeyError):
        cli.main(["replay", str(inputs / "columns.parquet")])


# ------------------------------------------------------------------------------------------- helpers
def test_validation_errors_are_one_line_with_the_key_path() -> None:
    from pydantic import ValidationError

    from divopd.train.config import TrainConfig

    with pytest.raises(ValidationError) as info:
        TrainConfig.model_validate({"setting": "s", "method": "divopd", "student": {"path": "a", "typo": 1},
                                    "sampler": {"batch_size": 0}})
    line = describe_validation_error(info.value)
    assert "\n" not in line
    assert "teacher: required key is missing" in line
    assert "student.typo: Extra inputs are not permitted" in line
    assert "sampler.batch_size: Input should be greater than or equal to 1 (got 0)" in line
    assert one_line("a\n  b\n\nc") == "a b c"


def test_model_folder_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(UsageError, match=r"student.path: .* is not a model folder \(no config.json\)"):
        check_model_folder(tmp_path / "m", "student.path")
    (tmp_path / "m" / "config.json").write_text("{}")
    check_model_folder(tmp_path / "m", "student.path")
    with pytest.raises(UsageError, match=r"\(a file, not a folder\)"):
        check_model_folder(tmp_path / "m" / "config.json", "k")
    with pytest.raises(UsageError, match=r"\(no such folder\)$"):
        check_model_folder("runs/sft/no-such-teacher", "teacher.path")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    check_model_folder("Qwen/Qwen2.5-0.5B", "teacher.path")  # online, a hub name is left to transformers
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match="offline"):
        check_model_folder("no-org/no-model-xyz", "teacher.path")


def test_transformers_os_error_becomes_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from divopd.models import ModelLoadError, load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "llama"}))  # no weights
    with pytest.raises(ModelLoadError) as info:
        load_model(str(tmp_path / "m"))
    assert isinstance(info.value, OSError) and "\n" not in str(info.value) and str(tmp_path / "m") in str(info.value)


# ------------------------------------------------------------------------------------------- third-party logs
@pytest.fixture
def fresh_loggers():
    saved = {name: logging.getLogger(name).level for name in cli.THIRD_PARTY_LOGGERS}
    for name in saved:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("verbose", ["", "flag", "env"])
def test_third_party_loggers_quiet_unless_verbose(inputs: Path, fresh_loggers: None, verbose: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIVOPD_VERBOSE", raising=False)
    argv = ["replay", str(inputs / "no-log")]
    if verbose == "flag":
        argv = ["--verbose", *argv]
    elif verbose == "env":
        monkeypatch.setenv("DIVOPD_VERBOSE", "1")
    assert cli.main(argv) == 2
    for name in ("py4j", "ray", "transformers", "urllib3", "filelock", "matplotlib", "torch", "vllm"):
        level = logging.getLogger(name).level
        assert level == (logging.NOTSET if verbose else logging.WARNING), name


def test_textworld_express_py4j_info_lines_are_gone(fresh_loggers: None, caplog: pytest.LogCaptureFixture) -> None:
    """A real TWX JVM start + close under a root logger at INFO: py4j's lines only with --verbose."""
    pytest.importorskip("textworld_express")
    from divopd.explore.envs import make_env

    def py4j_records() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            make_env("twx").close()
        return [r.getMessage() for r in caplog.records if r.name.startswith("py4j")]

    assert "Callback Server Starting" in py4j_records()  # verbose: the loggers are left as they are
    cli.quiet_third_party_loggers(verbose=False)
    assert py4j_records() == []


def test_the_command_modules_and_the_config_schema_do_not_import_torch() -> None:
    """A bad flag or a missing config file is answered before torch and transformers load (seconds of import on a
    small CPU): the CLI, every command module and the config schema import neither (checked in a fresh interpreter)."""
    modules = ["divopd.cli", "divopd.train.config", *(f"divopd.commands.{name}" for name in
                                                      ("bench", "eval", "export", "report", "sft", "train")),
               *(f"divopd.analysis.{name}" for name in ("replay", "simulate", "tune_cap"))]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
