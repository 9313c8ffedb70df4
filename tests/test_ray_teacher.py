"""teacher.shared under the Ray runtime: one teacher actor scores every explorer's turns (HF teacher here; a vLLM
teacher engine plugs in behind the same actor)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from divopd.experience.log import read_log
from test_train import assert_ledger_identity, tiny_config, tiny_models  # noqa: F401


def test_one_shared_teacher_actor_scores_for_every_explorer(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("ray")
    from divopd.train import train

    run_dir = tmp_path / "ray-shared"
    cfg = tiny_config(tiny_models, run_dir, "divopd", **{"runtime.kind": "ray", "runtime.ray_num_cpus": 2,
                                                         "runtime.num_explorers": 2, "runtime.explorer_cpus": 0.5,
                                                         "teacher.shared": True})
    summary = train(cfg)
    assert summary["updates"] == 3
    assert_ledger_identity(summary["ledger"])
    turns = [t.turn for t in read_log(run_dir / "experience")]
    explorers = {t.rollout_id.split("x")[-1].split("-")[0] for t in turns}
    assert explorers == {"0", "1"}  # both explorers produced turns ...
    assert summary["teacher/calls"] >= len({t.rollout_id for t in turns})  # ... scored by the one teacher actor
    assert all(np.isfinite(t.teacher_logprobs).all() for t in turns)
