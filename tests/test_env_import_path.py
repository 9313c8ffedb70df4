"""``explorer.env: module:Class``: an environment of the user's own, named by import path, is imported by
``make_env`` in the process that builds it — under ``runtime.kind: ray`` each explorer actor — so no registration in the
driver is needed (an ``ENVS`` entry added in the driver would not exist in the actors)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from divopd.errors import ConfigError
from divopd.explore.envs import ENVS, Env, check_env_name, env_class, make_env
from test_train import read_metrics, tiny_config, tiny_models  # noqa: F401

# A user's environment module: the tiny corridor game that also writes the pid of every process that builds it.
_MODULE = "divopd_user_envs_t43"
_SOURCE = textwrap.dedent('''
    import os
    from pathlib import Path

    from divopd.explore.envs.tiny import TinyEnv


    class PidCorridor(TinyEnv):
        name = "pid-corridor"

        def __init__(self, pid_dir: str = "", **kwargs):
            super().__init__(**kwargs)
            if pid_dir:
                Path(pid_dir, f"{os.getpid()}.pid").write_text("built")


    NOT_AN_ENV = 3


    class Plain:
        pass
''')


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The module above in its own folder, put on sys.path as PYTHONPATH would (Ray actors inherit it)."""
    folder = tmp_path / "userpkg"
    folder.mkdir()
    (folder / f"{_MODULE}.py").write_text(_SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    yield folder
    sys.modules.pop(_MODULE, None)


def test_an_import_path_builds_the_users_env(user_module: Path, tmp_path: Path) -> None:
    env = make_env(f"{_MODULE}:PidCorridor", num_rooms=3, pid_dir=str(tmp_path))
    assert isinstance(env, Env) and type(env).__name__ == "PidCorridor"
    assert env.reset(env.tasks("train")[0])
    assert [p.name for p in tmp_path.glob("*.pid")] == [f"{os.getpid()}.pid"]
    assert env_class("tiny").__name__ == "TinyEnv"  # registry names are unchanged
    assert f"{_MODULE}:PidCorridor" not in ENVS  # nothing was registered


@pytest.mark.parametrize(("name", "message"), [
    ("no_such_module_t43:Env", "explorer.env: cannot import 'no_such_module_t43'"),
    (f"{_MODULE}:Missing", f"explorer.env: module '{_MODULE}' has no attribute 'Missing'"),
    (f"{_MODULE}:NOT_AN_ENV", "is not a subclass of divopd.explore.envs.Env"),
    (f"{_MODULE}:Plain", "is not a subclass of divopd.explore.envs.Env"),
    ("mypkg.envs:", "is not an import path module:Class"),
    ("my-pkg:Env", "is not an import path module:Class"),
    ("mars", "explorer.env: unknown environment 'mars'"),
])
def test_a_bad_import_path_is_one_config_error(user_module: Path, name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")) as err:
        make_env(name)
    assert "\n" not in str(err.value)


def test_the_config_checks_the_form_without_importing(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """A finished run's config.yaml loads where its module is not installed (``divopd report`` reads it); the form
    is checked at load time, the class where the environment is built."""
    check_env_name("somewhere_not_installed.envs:MyEnv")
    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", **{"explorer.env": "somewhere_not_installed:MyEnv"})
    assert cfg.explorer.env == "somewhere_not_installed:MyEnv"
    with pytest.raises(ValueError, match="is not an import path module:Class"):
        tiny_config(tiny_models, tmp_path / "run", "divopd", **{"explorer.env": "a b:C"})


@pytest.mark.slow
def test_the_ray_explorer_actors_import_the_users_env(user_module: Path, tiny_models: dict[str, str],  # noqa: F811
                                                      tmp_path: Path) -> None:
    """A real Ray run on an import-path environment: the explorer and evaluator actors build it in their own
    processes (not the driver's), and the run trains."""
    pytest.importorskip("ray")
    from divopd.train import train

    pids = tmp_path / "pids"
    pids.mkdir()
    run_dir = tmp_path / "ray"
    cfg = tiny_config(tiny_models, run_dir, "divopd", **{
        "runtime.kind": "ray", "runtime.ray_num_cpus": 2, "updates": 2,
        "explorer.env": f"{_MODULE}:PidCorridor", "explorer.env_kwargs": f"{{pid_dir: {pids}}}"})
    summary = train(cfg)
    assert summary["updates"] == 2
    built = {int(p.stem) for p in pids.glob("*.pid")}
    assert built and os.getpid() not in built
    assert [r["update"] for r in read_metrics(run_dir) if r["kind"] == "update"] == [1, 2]
