"""Every command of the integration pages (docs/integrations/trinity.md, verl.md) and of examples/ runs as written.

The commands are read from the pages' fenced ``bash`` blocks, the examples' comment lines (``Task file``, ``Run:``) and
the verl launch script. Each is classified by what it needs: the CPU-runnable ones (``divopd tasks``, the plug-in folder
lookup, shell assignments) run verbatim in an empty folder, a page's commands in the page's order; a command that needs
an environment's setup this machine lacks (ALFWorld's game files, a WebShop server) must stop with one line and exit 2
naming what to install or set; the rest (package installs, GPU launch lines) are listed with the test that covers them
instead. A command no rule knows fails the test, so a new page line is never skipped silently.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "integrations" / name for name in ("trinity.md", "verl.md")]
TRINITY_EXAMPLES = sorted((ROOT / "examples" / "trinity").glob("*.yaml"))
VERL_SCRIPTS = sorted((ROOT / "examples" / "verl").glob("*.sh"))
PY_EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))

#: Commands that cannot run on this CPU machine, and where they are covered instead.
ELSEWHERE: dict[str, str] = {
    "pip install": "package install (tests/integrations/test_install_lines.py resolves the GPU install lines)",
    "uv pip install": "package install (tests/integrations/test_install_lines.py resolves it)",
    "make setup-": "builds a framework venv (the suite's own setup)",
    "make test-": "the framework test suites themselves",
    "trinity run": "GPU launch; its config is read by Trinity's loader in tests/integrations/trinity/test_plugin.py",
    "python -m verl.trainer.main_ppo": "GPU launch; composed by verl's Hydra in tests/integrations/verl",
    "hf download": "fetches model weights from the hub",
    "PYTHONPATH=src .venv-verl/bin/python examples/try_verl.py": "in the verl venv: verl/test_verl_try.py runs it",
    "PYTHONPATH=src .venv-trinity/bin/python examples/try_trinity.py":
        "in the Trinity venv: trinity/test_try_trinity.py runs it",
    "alfworld-download": "fetches ALFWorld's game files from the network",
    "export ALFWORLD_DATA": "points at ALFWorld's game files (absent here)",
}
#: Commands that run here, verbatim.
RUN_HERE = ("divopd tasks", "divopd try", "python -c", "python examples/", "DIR=", "MANAGER=", "DATA=", "mkdir ")
#: Environments whose setup this machine lacks: (what the one line must name).
NEEDS_SETUP = {"alfworld": ("divopd[alfworld]", "alfworld-download", "ALFWORLD_DATA"),
               "webshop": ("no WebShop server answers", "webshop_offline.server")}


def logical_lines(text: str) -> list[str]:
    """Shell lines with continuations joined and comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def page_commands(page: Path) -> list[str]:
    """The commands of ``page``'s fenced bash blocks, in page order (indented blocks included)."""
    blocks = re.findall(r"^[ \t]*```(?:bash|sh|shell|console)\n(.*?)^[ \t]*```", page.read_text(), re.M | re.S)
    return [line for block in blocks for line in logical_lines(block)]


def example_commands(path: Path) -> list[str]:
    """The commands a Trinity example names in its comment lines (``Run:``, ``Task file ...:``)."""
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"#\s*(?:Run|Task file[^:]*|Validation file[^:]*):\s+(.+)$", line)
        if m:
            out.append(m.group(1).strip())
    return out


def classify(command: str) -> str:
    """``run``, ``setup:<env>`` (needs an env's setup this machine lacks) or ``elsewhere``; ValueError if unknown."""
    words = shlex.split(command)
    if words[:2] == ["divopd", "tasks"] and words[2] in NEEDS_SETUP:
        return f"setup:{words[2]}"
    if command.startswith(RUN_HERE):
        return "run"
    if any(command.startswith(prefix) for prefix in ELSEWHERE):
        return "elsewhere"
    raise ValueError(f"no rule for the page command {command!r}: add it to RUN_HERE, NEEDS_SETUP or ELSEWHERE")


def sources() -> list[tuple[str, list[str]]]:
    return ([(p.relative_to(ROOT).as_posix(), page_commands(p)) for p in PAGES]
            + [(p.relative_to(ROOT).as_posix(), example_commands(p)) for p in TRINITY_EXAMPLES])


def shell_env() -> dict[str, str]:
    """The user's shell: this interpreter's bin folder first on PATH (``divopd``, ``python``), no ALFWorld data."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.pop("ALFWORLD_DATA", None)
    return env


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def run_in(folder: Path, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=folder, env=shell_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_every_page_and_example_command_has_a_rule() -> None:
    found = {name: cmds for name, cmds in sources()}
    assert found["docs/integrations/trinity.md"] and found["docs/integrations/verl.md"]
    for name, cmds in found.items():
        if name.startswith("examples/"):
            assert any("divopd tasks" in c for c in cmds), f"{name}: no task-file command in its comment lines"
        for cmd in cmds:
            classify(cmd)


@pytest.mark.parametrize("name", [p.relative_to(ROOT).as_posix() for p in PAGES + TRINITY_EXAMPLES])
def test_the_commands_run_as_written_in_an_empty_folder(name: str, tmp_path: Path) -> None:
    shutil_which_java = subprocess.run(["bash", "-c", "command -v java"], capture_output=True).returncode == 0
    commands = dict(sources())[name]
    ran = 0
    for cmd in commands:
        kind = classify(cmd)
        if kind == "elsewhere":
            continue
        if kind.startswith("setup:"):
            env = kind.split(":", 1)[1]
            if env == "webshop" and port_open(3000):
                continue  # a WebShop server runs here: the line would work, nothing to check
            done = run_in(tmp_path, cmd)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1, (cmd, done.returncode, done.stderr)
            for needle in NEEDS_SETUP[env]:
                assert needle in lines[0], (cmd, needle, lines[0])
            continue
        if "scienceworld" in cmd and not shutil_which_java:
            pytest.skip("ScienceWorld needs Java")
        done = run_in(tmp_path, cmd)
        assert done.returncode == 0, (cmd, done.stdout, done.stderr)
        ran += 1
        for out in re.findall(r"--out\s+(\S+)", cmd):
            assert (tmp_path / out).is_file(), (cmd, out)
    assert ran or name.startswith("examples/"), f"{name}: no command ran here"


@pytest.mark.parametrize("script", VERL_SCRIPTS, ids=[p.stem for p in VERL_SCRIPTS])
def test_the_verl_scripts_data_lines_run_as_written(script: Path, tmp_path: Path) -> None:
    """The script up to its launch line, verbatim (its ``set -euo pipefail`` included), in an empty folder: the data
    files it passes to verl exist afterwards."""
    text = script.read_text()
    head = text.split("\npython -m verl.trainer.main_ppo", 1)[0]
    assert head != text, f"{script.name}: no launch line"
    done = run_in(tmp_path, head)
    assert done.returncode == 0, (done.stdout, done.stderr)
    files = re.findall(r"data\.(?:train|val)_files=\"?([^\"\s]+)", text)
    assigned = dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, re.M))
    expanded = [re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: assigned[m.group(1)], f) for f in files]
    assert len(expanded) == 2 and all((tmp_path / f).is_file() for f in expanded), (expanded, done.stdout)


@pytest.mark.parametrize("script", PY_EXAMPLES, ids=[p.stem for p in PY_EXAMPLES])
def test_the_python_examples_say_how_to_run_them(script: Path) -> None:
    docstring = script.read_text().split('"""', 2)[1]
    assert f"python examples/{script.name}" in docstring, script.name


def test_the_examples_run_the_packaged_setting_or_say_why_on_line_one() -> None:
    """Each example's student, teacher and B are the packaged setting's (src/divopd/configs/<env>.yaml), or its first
    line says why not."""
    import yaml

    for path in TRINITY_EXAMPLES + VERL_SCRIPTS:
        text = path.read_text()
        env = next(e for e in ("alfworld", "scienceworld", "webshop") if e in path.stem)
        cfg = yaml.safe_load((ROOT / "src" / "divopd" / "configs" / f"{env}.yaml").read_text())
        first = next(line for line in text.splitlines() if not line.startswith("#!"))
        if "differs from the packaged setting" in first:
            continue
        assert cfg["student"]["path"] in text and cfg["teacher"]["path"] in text, path.name
        batch = cfg["sampler"]["batch_size"]
        assert re.search(rf"(?:train_batch_size[:=]\s*{batch}\b)", text), (path.name, batch)


def test_the_trinity_examples_start_the_tasks_divopd_tasks_suggests() -> None:
    """Each Trinity example's ``buffer.batch_size`` is what ``divopd tasks ... --for trinity`` prints for its setting
    (the matched dispatch at target_arrival_ratio 2, from half the horizon)."""
    import yaml

    from divopd.commands.tasks import trinity_batch_size_line
    from divopd.train.config import load_config

    for path in TRINITY_EXAMPLES:
        example = yaml.safe_load(path.read_text())
        env = path.stem.split("-")[0]
        line = trinity_batch_size_line(load_config(env), repeat_times=example["algorithm"].get("repeat_times", 1))
        suggested = int(re.search(r"buffer\.batch_size: (\d+)", line).group(1))
        assert example["buffer"]["batch_size"] == suggested, (path.name, line)
        args = example["algorithm"]["sample_strategy_args"]
        assert args["target_arrival_ratio"] == 2.0 and args["horizon"] == load_config(env).explorer.max_steps
