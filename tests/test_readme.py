"""The README and the docs stay true.

README: at most 150 lines, the two commands first, its sampler example runs and prints what its comments say, its
links resolve. Generated reference pages (docs/gen_reference.py): current, and every CLI verb, config key,
``metrics.jsonl`` key of a real training run, experience-log column and run-directory entry has its entry.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

from divopd.cli import COMMANDS
from divopd.experience.metric_keys import METRIC_KEYS
from divopd.train.config import config_reference
from test_train import tiny_models  # noqa: F401  (the tiny student and teacher fixture)

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
REFERENCE = REPO / "docs" / "reference"


def _gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _gen_reference()


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


# ---------------------------------------------------------------------------------------------------- README
def test_readme_is_short() -> None:
    assert len(README.splitlines()) <= 150


def test_the_two_commands_come_first() -> None:
    first_block = README.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block


def test_readme_sampler_example_runs_and_prints_its_comments() -> None:
    code = README.split("```python\n")[1].split("```")[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    printed = out.getvalue().splitlines()
    # each `print(...)  # <expected>` line: the output is the comment, up to a trailing ": explanation"
    comments = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(")]
    expected = [c.split("]: ")[0] + "]" if "]: " in c else c for c in comments]
    assert len(printed) == len(expected) == 3
    for got, want in zip(printed, expected, strict=True):
        assert got == want, (got, want)


def test_readme_lists_every_cli_verb() -> None:
    for name in COMMANDS:
        assert f"`divopd {name}" in README, name


def test_readme_and_docs_links_resolve() -> None:
    """Relative links of the README and of the hand-written docs pages point at files that exist."""
    files = [REPO / "README.md", REPO / "CONTRIBUTING.md"]
    files += [p for p in (REPO / "docs").rglob("*.md") if "results" not in p.parts]
    for path in files:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            resolved = (path.parent / target.split("#")[0]).resolve()
            assert resolved.exists(), f"{path.relative_to(REPO)}: broken link {target}"


# ---------------------------------------------------------------------------------------------------- reference
def test_generated_pages_are_current(tmp_path: Path) -> None:
    gen.generate(tmp_path)
    for name in gen.PAGES:
        fresh = (tmp_path / name).read_text()
        assert page(name) == fresh, f"docs/reference/{name} is stale: run `make docs` (python docs/gen_reference.py)"


def test_every_cli_verb_has_its_help_page_section() -> None:
    cli = page("cli.md")
    for name in COMMANDS:
        assert f"\n## divopd {name}\n" in cli, name
        assert f"usage: divopd {name}" in cli, name


def test_every_config_key_is_documented() -> None:
    config = page("config.md")
    for key, *_ in config_reference():
        assert f"| `{key}` |" in config, key


def test_every_log_column_is_documented() -> None:
    from divopd.experience.log import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, SCHEMA

    log = page("experience-log.md")
    assert set(SCHEMA.names) == set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS)
    for name in SCHEMA.names:
        assert f"| `{name}` |" in log, name
        assert gen.LOG_COLUMNS.get(name), name
    assert not set(gen.LOG_COLUMNS) - set(SCHEMA.names), "documented columns that the schema does not have"


def _documented(key: str, patterns: list[str]) -> bool:
    return any(re.fullmatch(re.sub(r"<[a-z_]+>", "[A-Za-z0-9_]+", re.escape(p).replace(r"\<", "<").replace(r"\>", ">")),
                            key) for p in patterns)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, str]) -> Path:  # noqa: F811
    """A real 2-update DivOPD+R training run (lockstep, tiny env and models, diagnostics and evals on)."""
    from divopd.train.config import load_config
    from divopd.train.run import train

    out = tmp_path_factory.mktemp("docs-run")
    paths = tiny_models
    run_dir = out / "run"
    data = {
        "setting": "docs", "method": "divopd-r", "seed": 0, "updates": 2, "run_dir": str(run_dir),
        "student": {"path": paths["student"]}, "teacher": {"path": paths["teacher"]},
        "sampler": {"batch_size": 6, "pool_factor": 4, "cap": 2, "max_staleness": 2},
        "explorer": {"env": "tiny", "num_envs": 3, "max_steps": 5,
                     "recovery": {"enabled": True, "patience": 1, "max_takeover": 1}},
        "eval": {"every": 1, "tasks": 3, "at_start": True}, "diagnostics": {"every": 1},
        "runtime": {"kind": "lockstep"}, "checkpoint": {"every": 1, "keep": 1},
    }
    train(load_config(data=data))
    return run_dir


def test_every_metrics_key_of_a_real_run_is_documented(tiny_run: Path) -> None:
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"update", "eval"}
    patterns = [k for k, _, _ in METRIC_KEYS]
    metrics = page("metrics.md")
    keys = {k for r in records for k in r}
    assert len(keys) > 60
    missing = sorted(k for k in keys if not _documented(k, patterns))
    assert not missing, f"metrics.jsonl keys without an entry in divopd.experience.metric_keys.METRIC_KEYS: {missing}"
    for key in patterns:
        assert f"| `{key}` |" in metrics, key


def test_every_run_dir_entry_and_summary_key_is_documented(tiny_run: Path) -> None:
    documented = {p.rstrip("/") for p, _ in gen.RUN_DIR}
    for entry in tiny_run.iterdir():
        assert entry.name in documented, entry.name
    for ckpt in (tiny_run / "checkpoints").iterdir():
        assert re.fullmatch(r"update-\d{6}", ckpt.name), ckpt.name
        assert {"optimizer.pt", "state.json", "model.safetensors"} <= {p.name for p in ckpt.iterdir()}
    summary = json.loads((tiny_run / "summary.json").read_text())
    assert set(summary) <= {k for k, _ in gen.SUMMARY}, set(summary) - {k for k, _ in gen.SUMMARY}
    assert all(f"| `{k}` |" in page("run-dir.md") for k in summary)
