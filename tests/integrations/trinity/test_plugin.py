"""Trinity-RFT finds the strategy: through ``--plugin-dir`` / ``TRINITY_PLUGIN_DIRS``, through its dotted path, and
from the example configs, which switch Trinity's on-policy distillation to DivOPD with the ``sample_strategy`` line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trinity.algorithm.sample_strategy")

from omegaconf import OmegaConf  # noqa: E402
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY  # noqa: E402
from trinity.common.config import Config, load_config  # noqa: E402

from divopd.integrations.trinity import DivOPDSampleStrategy, sampler_config  # noqa: E402
from divopd.integrations.trinity_plugin import PLUGIN_DIR  # noqa: E402

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "trinity").glob("*-divopd.yaml"))


def test_trinity_loads_the_plugin_directory() -> None:
    """What ``trinity run --plugin-dir DIR`` does: set TRINITY_PLUGIN_DIRS, then ``load_plugins()``."""
    code = ("from trinity.utils.plugin_loader import load_plugins; load_plugins(); "
            "from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY; c = SAMPLE_STRATEGY.get('divopd'); "
            "print(c.__module__, c.__name__)")
    env = {**os.environ, "TRINITY_PLUGIN_DIRS": PLUGIN_DIR}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["divopd.integrations.trinity", "DivOPDSampleStrategy"]


def test_the_dotted_path_names_the_same_class() -> None:
    assert SAMPLE_STRATEGY.get("divopd.integrations.trinity.DivOPDSampleStrategy") is DivOPDSampleStrategy
    assert SAMPLE_STRATEGY.get("divopd") is DivOPDSampleStrategy


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_an_example_config_switches_to_divopd_with_one_line(path: Path, tmp_path: Path) -> None:
    config = load_config(str(path))  # Trinity's own loader: an unknown key fails here
    assert SAMPLE_STRATEGY.get(config.algorithm.sample_strategy) is DivOPDSampleStrategy
    settings = sampler_config(config.algorithm.sample_strategy_args, config.buffer.train_batch_size)
    assert settings.batch_size == config.buffer.train_batch_size
    assert config.buffer.trainer_input.experience_buffer.storage_type == "queue"
    # without the sample_strategy lines it is Trinity's plain run of the same setting, nothing else differs
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("sample_strategy")]
    plain_path = tmp_path / path.name
    plain_path.write_text("\n".join(lines) + "\n")
    plain = load_config(str(plain_path))
    assert plain.algorithm.sample_strategy is None
    a, b = (OmegaConf.to_container(OmegaConf.structured(c)) for c in (config, plain))
    for side in (a, b):
        side["algorithm"].pop("sample_strategy")
        side["algorithm"].pop("sample_strategy_args")
    assert a == b and isinstance(config, Config)


def test_there_is_an_example_per_paper_environment() -> None:
    assert [p.stem for p in EXAMPLES] == ["alfworld-divopd", "scienceworld-divopd", "webshop-divopd"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_an_example_names_a_registered_divopd_workflow_a_teacher_and_the_task_command(path: Path) -> None:
    from trinity.common.workflows import WORKFLOWS

    import divopd.integrations.trinity_workflow  # noqa: F401  (what --plugin-dir loads)

    config = load_config(str(path))
    name = config.buffer.explorer_input.default_workflow_type
    assert name.startswith("divopd_") and WORKFLOWS.get(name) is not None
    assert config.mode == "both" and config.explorer.auxiliary_models[0].model_path
    env = path.stem.split("-")[0]
    command = f"divopd tasks {env} --for trinity --split train --out tasks/{env}/train.jsonl"
    assert command in path.read_text() and config.buffer.explorer_input.taskset.path == f"tasks/{env}"


#: What a template leaves for the user to fill in: none of it may stay in an example that "runs as is".
PLACEHOLDERS = re.compile(r"path/to|/path/|<[a-z_ -]+>|\bTODO\b|\bFIXME\b|CHANGEME|\byour[-_ ]|\.\.\./|xxx", re.I)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_an_example_has_no_placeholder_and_every_model_is_a_hub_id_the_page_names(path: Path) -> None:
    text = path.read_text()
    assert PLACEHOLDERS.search(text) is None, f"{path.name}: placeholder {PLACEHOLDERS.search(text).group()!r}"
    config = load_config(str(path))
    page = (Path(__file__).resolve().parents[3] / "docs" / "integrations" / "trinity.md").read_text()
    for model_path in [config.model.model_path] + [m.model_path for m in config.explorer.auxiliary_models]:
        assert HUB_ID.match(model_path) and not model_path.startswith(("path/", "./", "../")), model_path
        assert f"`{model_path}`" in page, f"docs/integrations/trinity.md does not name {model_path}"
