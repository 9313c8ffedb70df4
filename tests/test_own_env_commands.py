"""An environment of the user's own, named by its import path ``module:Class`` (registered nowhere), through the
commands that take an environment besides ``train`` and ``sft`` (tests/test_sft_cli.py): ``divopd eval`` and
``divopd bench`` with a plan whose ``configs`` is the user's own config file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from divopd.cli import main
from divopd.train.config import dump_config
from test_train import tiny_config, tiny_models  # noqa: F401

MODULE = "divopd_user_cmd_env"
ENV = f"{MODULE}:MyCorridor"


@pytest.fixture
def own_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's own on sys.path with an Env subclass (the tiny corridor under another name)."""
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / f"{MODULE}.py").write_text(
        "from divopd.explore.envs.tiny import TinyEnv\n\n\nclass MyCorridor(TinyEnv):\n    name = 'my-corridor'\n")
    monkeypatch.syspath_prepend(str(pkg))
    return ENV


def _own_config(models: dict[str, str], tmp_path: Path, env: str) -> Path:
    config = tmp_path / "my-config.yaml"
    cfg = tiny_config(models, tmp_path / "run", "vanilla", **{"explorer.env": env, "setting": "my-corridor"})
    config.write_text(dump_config(cfg))
    return config


def test_eval_takes_an_environment_by_import_path(tiny_models, own_env, tmp_path, capsys) -> None:  # noqa: F811
    config = _own_config(tiny_models, tmp_path, own_env)
    out = tmp_path / "eval.json"
    assert main(["eval", tiny_models["student"], "--config", str(config), "--tasks", "3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["eval/episodes"] == 3.0
    capsys.readouterr()
    bad = ["eval", tiny_models["student"], "--config", str(config), "--set", "explorer.env=no_such_module_y:Env"]
    assert main(bad) == 2
    err = capsys.readouterr().err  # one line (after the model's load progress), no traceback
    assert "cannot import 'no_such_module_y'" in err.strip().splitlines()[-1] and "Traceback" not in err


def test_bench_runs_a_plan_on_a_config_with_an_own_environment(tiny_models, own_env, tmp_path,  # noqa: F811
                                                                monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _own_config(tiny_models, tmp_path, own_env)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"out": "runs/own", "configs": "my-config.yaml", "updates": 1, "seeds": [0],
                                    "settings": {"corridor": {}},
                                    "methods": [{"method": "vanilla"}, {"method": "divopd"}]}))
    assert main(["bench", "paper", "--plan", str(plan)]) == 0
    for method in ("vanilla", "divopd"):
        run = tmp_path / "runs/own/corridor" / method / "seed0"
        assert json.loads((run / "summary.json").read_text())["updates"] == 1
        assert yaml.safe_load((run / "config.yaml").read_text())["explorer"]["env"] == own_env
    assert "divopd bench: reports in" in capsys.readouterr().out
    plan.write_text(yaml.safe_dump({"configs": "missing.yaml", "seeds": [0], "settings": {"a": {}},
                                    "methods": [{"method": "vanilla"}]}))
    assert main(["bench", "paper", "--plan", str(plan), "--dry-run"]) == 2
    assert "configs 'missing.yaml': no such config file" in capsys.readouterr().err
