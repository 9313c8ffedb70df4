"""The sharded learner: FSDP2 ranks on gloo give the single-process learner's update; DCP checkpoints
resume with the same or another number of ranks; a dead rank stops the run with a checkpoint to resume from."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from divopd.learn.sharded import LearnerRankError, split_rows
from divopd.train import train
from divopd.train.assemble import open_run, run_trainer
from test_faults_resume import _timed
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

UPDATES = 4
#: Adam divides each coordinate's step by its gradient's magnitude, so where a gradient is ~0 the float rounding of
#: the two orders of summation (one pass over B rows vs two over B/2, then a reduce-scatter) moves a few weights by up
#: to ~lr/100 per update (measured: 1.6e-5 at lr 1e-3 after 4 updates, on 6 of 150k weights). At lr 1e-4 (still 10x
#: the default learner.lr) that is 10x below the 1e-5 bound.
LR = 1e-4


def _run(models: dict[str, str], run_dir: Path, world_size: int, updates: int = UPDATES, **over: object) -> dict:
    cfg = tiny_config(models, run_dir, "divopd", updates=updates,
                      **{"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 100,
                         "checkpoint.every": 2, "learner.world_size": world_size, "learner.lr": LR, **over})
    return train(cfg)


def _losses(run_dir: Path, key: str = "learner/loss") -> list[float]:
    return [r[key] for r in read_metrics(run_dir) if r["kind"] == "update"]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    last = sorted((run_dir / "checkpoints").glob("update-*"))[-1]
    return load_file(str(last / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _close(a: object, b: object) -> bool:
    """Equal, or (numbers) within the tolerance of the runs above: 1e-4, relative above 1."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a == b or abs(a - b) <= 1e-4 * max(1.0, abs(a))
    return a == b


def test_split_rows_covers_every_row_once() -> None:
    for n, w in ((6, 2), (7, 3), (1, 2)):
        parts = split_rows(n, w)
        assert len(parts) == w and np.array_equal(np.concatenate(parts), np.arange(n))


def test_world_size_2_gives_the_single_process_run(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    one = _run(tiny_models, tmp_path / "ws1", 1)
    two = _run(tiny_models, tmp_path / "ws2", 2)
    assert one["updates"] == two["updates"] == UPDATES
    la, lb = _losses(tmp_path / "ws1"), _losses(tmp_path / "ws2")
    assert len(la) == UPDATES and max(abs(a - b) for a, b in zip(la, lb, strict=True)) <= 1e-4
    # the gradient itself, not only Adam's scale-free step: summed over ranks, not averaged
    ga, gb = _losses(tmp_path / "ws1", "learner/grad_norm"), _losses(tmp_path / "ws2", "learner/grad_norm")
    assert max(abs(a - b) / a for a, b in zip(ga, gb, strict=True)) <= 1e-4
    assert _max_diff(_weights(tmp_path / "ws1"), _weights(tmp_path / "ws2")) <= 1e-5
    rows = [r for r in read_metrics(tmp_path / "ws2") if r["kind"] == "update"]
    assert all(r["time/publish_s"] > 0 for r in rows)
    # the sharded checkpoint holds the DCP shards next to the HF folder that `divopd eval` reads
    last = sorted((tmp_path / "ws2" / "checkpoints").glob("update-*"))[-1]
    assert (last / "dcp" / ".metadata").is_file() and (last / "config.json").is_file()


# Slow: by default the spawned ranks: test_world_size_2_gives_the_single_process_run
@pytest.mark.slow
def test_the_threads_runtime_spawns_the_ranks_too(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Ranks start by themselves under the threads runtime as under lockstep (explorer threads beside the ranks)."""
    summary = _run(tiny_models, tmp_path / "threads", 2, updates=3, **{"runtime.kind": "threads"})
    assert summary["updates"] == 3 and not summary["interrupted"]
    assert_ledger_identity(summary["ledger"])
    rows = [r for r in read_metrics(tmp_path / "threads") if r["kind"] == "update"]
    assert [r["update"] for r in rows] == [1, 2, 3] and all(r["time/publish_s"] > 0 for r in rows)
    last = sorted((tmp_path / "threads" / "checkpoints").glob("update-*"))[-1]
    assert (last / "dcp" / ".metadata").is_file()


class _KillRank:
    """A progress hook that SIGKILLs one learner rank after update ``at``."""

    def __init__(self, rank: int, at: int) -> None:
        self.rank, self.at = rank, at

    def on_update(self, trainer: object, metrics: dict) -> None:
        if trainer.version == self.at:  # type: ignore[attr-defined]
            os.kill(trainer.learner.ranks.pids[self.rank], signal.SIGKILL)  # type: ignore[attr-defined]

    def on_eval(self, update: int, results: dict) -> None:
        pass


@pytest.mark.slow
def test_a_dead_rank_stops_the_run_and_resume_works_with_1_and_2_ranks(tiny_models: dict[str, str],  # noqa: F811
                                                                         tmp_path: Path) -> None:
    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=6,
                      **{"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 100,
                         "checkpoint.every": 2, "learner.world_size": 2, "learner.lr": LR})
    trainer, _ = open_run(cfg)
    with pytest.raises(LearnerRankError, match=r"learner rank 1 of 2 \(pid \d+, exit code -9\)"):
        run_trainer(trainer, _KillRank(rank=1, at=3))
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("update-*"))
    assert ckpts[-1] == "update-000002"  # the newest checkpoint before the kill: the one to resume from
    for ws in (1, 2):
        shutil.copytree(tmp_path / "run", tmp_path / f"resume{ws}")
        cfg_ws = cfg.model_copy(update={"run_dir": str(tmp_path / f"resume{ws}"),
                                        "learner": cfg.learner.model_copy(update={"world_size": ws})})
        summary = train(cfg_ws, resume=tmp_path / f"resume{ws}")
        assert summary["resumed"] and summary["updates"] == 6
    l1, l2 = _losses(tmp_path / "resume1"), _losses(tmp_path / "resume2")
    assert len(l1) == 6 and max(abs(a - b) for a, b in zip(l1, l2, strict=True)) <= 1e-4
    assert _max_diff(_weights(tmp_path / "resume1"), _weights(tmp_path / "resume2")) <= 1e-5


@pytest.mark.slow
def test_the_cli_gives_the_same_series_with_2_ranks(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    import subprocess
    import sys

    import yaml

    cfg = tiny_config(tiny_models, tmp_path / "unused", "divopd", updates=UPDATES,
                      **{"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "eval.every": 100,
                         "learner.lr": LR})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    for ws in (1, 2):
        subprocess.run([sys.executable, "-m", "divopd", "train", str(path), "--no-progress", "--run-dir",
                        str(tmp_path / f"ws{ws}"), "--set", f"learner.world_size={ws}"], check=True, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    la, lb = _losses(tmp_path / "ws1"), _losses(tmp_path / "ws2")
    assert len(la) == UPDATES and max(abs(a - b) for a, b in zip(la, lb, strict=True)) <= 1e-4
    assert _max_diff(_weights(tmp_path / "ws1"), _weights(tmp_path / "ws2")) <= 1e-5


@pytest.mark.slow
def test_dcp_checkpoints_reshard_and_the_options_run(tmp_path: Path) -> None:
    """A 2-rank checkpoint (with activation checkpointing) resumes on 1 and on 3 ranks to the same next update; bf16
    mixed precision trains (to bf16 accuracy)."""
    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.learn.sharded import ShardedLearner
    from test_learner import WORDS, build_model, build_tokenizer, make_turns

    tok = build_tokenizer([WORDS], kind="word")
    turns = make_turns(tok, build_model(tok, "0.2m", seed=100), n=7)
    build_model(tok, "0.2m", seed=0).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = LearnerConfig(lr=LR, world_size=2, activation_checkpointing=True)
    two = ShardedLearner(str(tmp_path / "m"), cfg)
    try:
        first = [two.step(turns)["learner/loss"] for _ in range(2)]
        two.save_checkpoint(tmp_path / "ckpt")
        expected = two.step(turns)["learner/loss"]
    finally:
        two.close()
    one, _ = Learner.from_checkpoint(tmp_path / "ckpt", cfg.model_copy(update={"world_size": 1}))
    three, _ = ShardedLearner.from_checkpoint(tmp_path / "ckpt", cfg.model_copy(update={"world_size": 3}))
    try:
        assert one.version == three.version == 2
        assert abs(one.step(turns)["learner/loss"] - expected) <= 1e-4
        assert abs(three.step(turns)["learner/loss"] - expected) <= 1e-4
    finally:
        three.close()
    bf16 = ShardedLearner(str(tmp_path / "m"), cfg.model_copy(update={"mixed_precision": "bf16"}))
    try:
        assert abs(bf16.step(turns)["learner/loss"] - first[0]) <= 1e-2
    finally:
        bf16.close()


@pytest.fixture(scope="module")
def lora_runs(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A LoRA run (rank 4) with 1 process (``ws1/``) and with 2 ranks (``ws2/``), checkpoints at updates 2 and 4."""
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("lora-sharded")
    lora = {"student.lora.rank": 4, "learner.lr": 10 * LR, "checkpoint.keep": 2}
    for ws in (1, 2):
        assert _run(tiny_models, root / f"ws{ws}", ws, **lora)["updates"] == UPDATES
    return root


# Slow: two LoRA runs; by default the sharded learner: test_world_size_2_gives_the_single_process_run, and LoRA:
# tests/test_lora.py
@pytest.mark.slow
def test_a_lora_student_with_2_ranks_gives_the_single_process_lora_run(lora_runs: Path) -> None:
    """FSDP2 over a PEFT-injected student: the same adapters on every rank, AdamW on the adapter only; the run, its
    published adapters and its adapter-only checkpoints (PEFT's files, DCP shards of the adapter) are the one-process
    LoRA learner's, and its checkpoint resumes on 2 ranks and on 1 process to the one-process resume's next update."""
    from safetensors.torch import load_file

    from divopd.learn.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
    from divopd.learn.safe_dcp import read_metadata

    rows1, rows2 = read_metrics(lora_runs / "ws1"), read_metrics(lora_runs / "ws2")
    assert [r["kind"] for r in rows1] == [r["kind"] for r in rows2] and len(rows1) > UPDATES
    for a, b in zip(rows1, rows2, strict=True):
        # every untimed value; the padded input slots are per rank's micro-batches, not the batch's
        keys = [k for k in a if not _timed(k) and k != "learner/input_slots"]
        assert keys and set(keys) <= set(b)
        bad = {k: (a[k], b[k]) for k in keys if not _close(a[k], b[k])}
        assert not bad, bad
    losses = [r["learner/loss"] for r in rows1 if r["kind"] == "update"]
    assert len(losses) == UPDATES and len(set(losses)) > 1, "the adapter trains: the loss moves"
    last1, last2 = (lora_runs / d / "checkpoints" / "update-000004" for d in ("ws1", "ws2"))
    a1, a2 = load_file(str(last1 / ADAPTER_WEIGHTS)), load_file(str(last2 / ADAPTER_WEIGHTS))
    assert _max_diff(a1, a2) <= 1e-5 and max(float(t.abs().max()) for k, t in a2.items() if "lora_B" in k) > 0
    assert all(".lora_A." in k or ".lora_B." in k for k in a2), "the adapter's tensors only"
    assert (last2 / ADAPTER_CONFIG).is_file() and not (last2 / "config.json").exists()
    assert not list(last2.glob("model*.safetensors"))
    tensors = [k for k in read_metadata(last2 / "dcp").state_dict_metadata if not k.startswith("optim.param_groups")]
    assert any(k.startswith("model.") for k in tensors) and any(k.startswith("optim.state.") for k in tensors)
    assert all(".lora_" in k for k in tensors), [k for k in tensors if ".lora_" not in k][:3]
    _check_lora_resumes(lora_runs, [("ws2", 1), ("ws2", 2)])


@pytest.mark.slow
def test_a_one_process_lora_checkpoint_resumes_on_2_ranks(lora_runs: Path) -> None:
    _check_lora_resumes(lora_runs, [("ws1", 2)])


def _check_lora_resumes(root: Path, cases: list[tuple[str, int]]) -> None:
    """Each (run, world size): that run's update-2 checkpoint, resumed with that many ranks, takes the one-process
    run's resumed next update (the adapter, its AdamW moments and the counters restored)."""
    from divopd.learn.checkpoint import read_state
    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.learn.sharded import learner_from_checkpoint
    from test_lora import _turns

    ref_ckpt = root / "ws1" / "checkpoints" / "update-000002"
    cfg = LearnerConfig(**read_state(ref_ckpt)["config"])
    ref, _ = Learner.from_checkpoint(ref_ckpt, cfg)
    turns = _turns(ref.model.get_input_embeddings().num_embeddings)
    expected, adapter = ref.step(turns)["learner/loss"], ref.publish().state_dict
    for run, ws in cases:
        learner, _ = learner_from_checkpoint(root / run / "checkpoints" / "update-000002",
                                             cfg.model_copy(update={"world_size": ws}))
        try:
            assert learner.version == 2 and abs(learner.step(turns)["learner/loss"] - expected) <= 1e-4, (run, ws)
            handle = learner.publish()
            assert handle.adapter is not None and _max_diff(handle.state_dict, adapter) <= 1e-5, (run, ws)
        finally:
            learner.close()
