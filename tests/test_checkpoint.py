"""Atomic directories, JSON-only extra state and checkpoint discovery (divopd.learn.checkpoint)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from divopd.learn.checkpoint import WeightHandle, atomic_dir, latest_checkpoint, read_state, to_json_safe
from divopd.learn.learner import Learner, LearnerConfig
from divopd.models.tiny import build_model, build_tokenizer

torch.set_num_threads(1)


def test_atomic_dir_replaces_only_on_success(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("one")
    assert (target / "a.txt").read_text() == "one"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("half-written")
        raise RuntimeError("killed mid-write")
    assert (target / "a.txt").read_text() == "one"  # the previous checkpoint survives
    with atomic_dir(target) as tmp:
        (tmp / "b.txt").write_text("two")
    assert not (target / "a.txt").exists() and (target / "b.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp or backup left behind


def test_extra_state_is_plain_json_and_keeps_nan():
    state = {"a": np.arange(3), "b": (1, np.float32(2.5)), "c": float("nan"), "d": {"e": np.bool_(True), 3: None}}
    safe = to_json_safe(state)
    back = json.loads(json.dumps(safe, allow_nan=True))
    assert back["a"] == [0, 1, 2] and back["b"] == [1, 2.5] and math.isnan(back["c"]) and back["d"] == {"e": True,
                                                                                                          "3": None}
    with pytest.raises(TypeError, match="object"):
        to_json_safe({"x": object()})


def test_latest_checkpoint_and_state(tmp_path):
    tok = build_tokenizer(["a b c d e"], kind="word")
    learner = Learner(build_model(tok, "0.2m"), LearnerConfig(), tok)
    assert latest_checkpoint(tmp_path / "checkpoints") is None
    for version in (3, 12, 7):
        learner.version = version
        learner.save_checkpoint(tmp_path / "checkpoints" / f"update-{version:06d}", {"note": version})
    (tmp_path / "checkpoints" / ".update-000099.tmp-x").mkdir()  # an interrupted write is ignored
    best = latest_checkpoint(tmp_path / "checkpoints")
    assert best.name == "update-000012" and read_state(best)["extra_state"] == {"note": 12}
    with pytest.raises(FileNotFoundError, match="not a divopd checkpoint"):
        read_state(tmp_path)
    with pytest.raises(ValueError, match="neither"):
        WeightHandle(version=0).load_into(learner.model)
