"""The verl example (``examples/verl/*.sh``) runs as it is: its override lines, read from the script, compose with
verl 0.9.1's own ``ppo_trainer`` config (Hydra), turn the teacher on with a hub model and a teacher resource pool
verl accepts, name divopd's agent loop (registered in verl's registry), manager and sampler (loaded the way verl's
trainer loads them), read the data files the script's own ``divopd tasks`` lines write, and leave no placeholder."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

pytest.importorskip("verl")

import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.import_utils import load_extern_type  # noqa: E402
from verl.workers.config import DistillationConfig  # noqa: E402
from verl_launch import EXAMPLES, ROOT, read_script  # noqa: E402

#: What a template leaves for the user to fill in (the same rule as the Trinity-RFT examples' test).
PLACEHOLDERS = re.compile(r"path/to|/path/|<[a-z_ -]+>|\bTODO\b|\bFIXME\b|CHANGEME|\byour[-_ ]|\.\.\./|xxx", re.I)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@pytest.fixture(scope="module", params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def example(request: pytest.FixtureRequest) -> tuple[Path, list[str], list[list[str]], object]:
    overrides, tasks = read_script(request.param)
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    return request.param, overrides, tasks, config


def test_there_is_a_verl_example() -> None:
    assert EXAMPLES, "examples/verl/ has no launch script"


def test_the_example_turns_the_teacher_on_with_a_pool_verl_accepts(example) -> None:
    path, _, _, config = example
    assert config.distillation.enabled is True
    teacher = config.distillation.teacher_models.teacher_model.model_path
    page = (ROOT / "docs" / "integrations" / "verl.md").read_text()
    for model in (teacher, config.actor_rollout_ref.model.path):
        assert model and HUB_ID.match(model), model
        assert model in page, f"docs/integrations/verl.md does not name {model}"
    distillation: DistillationConfig = omega_conf_to_dataclass(config.distillation)  # as verl's trainer builds it
    assert distillation.nnodes > 0 and distillation.n_gpus_per_node > 0  # verl's trainer refuses a pool of 0
    assert distillation.teacher_models["default"].num_replicas >= 1
    assert config.distillation.distillation_loss.loss_mode in ("k3", "k1")


def test_the_example_names_divopds_agent_loop_manager_and_sampler(example) -> None:
    _, _, _, config = example
    agent = config.actor_rollout_ref.rollout.agent
    manager = agent.agent_loop_manager_class
    module, _, name = manager.rpartition(".")
    assert getattr(importlib.import_module(module), name)  # importing it registers divopd's agent loop
    assert agent.default_agent_loop in _agent_loop_registry
    assert config.actor_rollout_ref.rollout.calculate_log_probs is True
    sampler = config.trainer.v1.sampler
    cls = load_extern_type(sampler.custom_sampler.path, sampler.custom_sampler.name)  # as verl's trainer loads it
    assert cls.__name__ == "DivOPDReplayBuffer"
    assert sampler.sampler_kwargs.method == "divopd"


def test_the_example_reads_the_files_its_divopd_tasks_lines_write(example) -> None:
    _, _, tasks, config = example
    written = {cmd[cmd.index("--out") + 1] for cmd in tasks}
    assert all("--for" in cmd and cmd[cmd.index("--for") + 1] == "verl" for cmd in tasks), tasks
    assert {config.data.train_files, config.data.val_files} == written


def test_the_example_has_no_placeholder(example) -> None:
    path = example[0]
    found = PLACEHOLDERS.search(path.read_text())
    assert found is None, f"{path.name}: placeholder {found.group()!r}"
