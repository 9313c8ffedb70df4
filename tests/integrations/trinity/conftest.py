"""Fixtures of the Trinity-RFT integration tests: a local Ray, and a real divopd experience log.

The log comes from a short ``divopd train`` run (lockstep runtime: one process, deterministic) on the pure-Python
``tiny`` env with random-init tiny student and teacher models, the setting of the project's own lockstep tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from opd_stream import SETTINGS, UPDATES

from tiny_models import build_tiny_models  # tests/, on the path through tests/conftest.py


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance on 2 CPUs (queue actors take no CPU), shut down after the session."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def divopd_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The experience log (a part directory) of a real lockstep ``divopd train`` run of :data:`UPDATES` updates."""
    root = tmp_path_factory.mktemp("divopd-run")
    models = build_tiny_models(root / "models")
    config = {
        "setting": "trinity-tiny", "method": "divopd", "seed": 0, "updates": UPDATES, "run_dir": str(root / "run"),
        "student": {"path": models["student"]}, "teacher": {"path": models["teacher"]},
        "sampler": SETTINGS, "learner": {"lr": 1e-3},
        "explorer": {"env": "tiny", "num_envs": 3, "max_steps": 5, "eval_tasks": 3},
        "eval": {"every": 100, "tasks": 3, "at_start": False}, "checkpoint": {"every": 100, "keep": 1},
        "runtime": {"kind": "lockstep", "torch_threads": 1, "lockstep": {"env_steps_per_update": 9}},
    }
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-m", "divopd.cli", "train", str(path)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    log = root / "run" / "experience"
    assert any(log.glob("part-*.parquet")), f"no experience log in {log}"
    return log
