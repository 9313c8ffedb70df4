"""Re-make ``data/tiny-lockstep/``: the experience log of a real lockstep ``divopd train`` run (the turn stream of
the plug-in tests).

Run from the repo root in the main venv (it trains; the verl venv has no transformers divopd can use)::

    .venv/bin/python tests/integrations/verl/make_fixture.py

A random-init tiny student and teacher on the built-in ``tiny`` environment, ``runtime.kind: lockstep`` (one process,
deterministic), 12 updates of B = 6 with a producer load that leaves turns to go stale. The test only reads the log
(``data/tiny-lockstep/experience``, token ids not stored) and the run's ``summary.json``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from divopd.train import train
from divopd.train.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the tests' tiny models
from tiny_models import build_tiny_models  # noqa: E402

OUT = Path(__file__).resolve().parent / "data" / "tiny-lockstep"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        models = build_tiny_models(Path(tmp) / "models")
        run_dir = Path(tmp) / "run"
        data = {
            "setting": "verl-fixture", "method": "divopd", "seed": 0, "updates": 12, "run_dir": str(run_dir),
            "log_token_ids": False,
            "student": {"path": models["student"]}, "teacher": {"path": models["teacher"]},
            "sampler": {"batch_size": 6, "pool_factor": 4, "cap": 2, "max_staleness": 1},
            "learner": {"lr": 1e-3},
            "explorer": {"env": "tiny", "num_envs": 4, "max_steps": 5, "eval_tasks": 2},
            "eval": {"every": 100, "tasks": 2, "at_start": False},
            "checkpoint": {"every": 100, "keep": 1},
            "runtime": {"kind": "lockstep", "lockstep": {"env_steps_per_update": 10}},
        }
        train(load_config(data=data))
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        shutil.copytree(run_dir / "experience", OUT / "experience")
        shutil.copy(run_dir / "summary.json", OUT / "summary.json")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
