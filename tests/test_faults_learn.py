"""Untrusted files and open ports on the learner side: a sharded checkpoint's DCP index and values are read without
running code from them (a planted payload is refused in one line and never runs), a genuine FSDP/DCP checkpoint still
resumes, and the learner ranks' rendezvous store listens on 127.0.0.1 only."""

from __future__ import annotations

import os
import pickle
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from divopd.errors import UsageError
from divopd.learn import safe_dcp
from divopd.learn.dist_worker import free_port
from divopd.learn.rendezvous import rendezvous_store
from test_sharded import LR


class _Payload:
    """Pickles to ``os.system("touch <marker>")``: what a planted checkpoint would run on a plain ``pickle.load``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def _plant(folder: Path, marker: Path) -> Path:
    """Replace the folder's ``.metadata`` with the payload pickle."""
    meta = folder / ".metadata"
    meta.write_bytes(pickle.dumps(_Payload(marker)))
    return meta


def _small_dcp(folder: Path, **extra: object) -> dict[str, torch.Tensor]:
    model = torch.nn.Linear(3, 2)
    state = {"model": dict(model.state_dict()), **extra}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder))
    return {k: v.clone() for k, v in model.state_dict().items()}


def _listening(port: int) -> list[str]:
    """The local addresses listening on ``port`` (hex ``ADDR:PORT`` from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                found.append(fields[1].rsplit(":", 1)[0])
    return found


def test_a_planted_dcp_index_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _small_dcp(tmp_path / "ckpt")
    meta = _plant(tmp_path / "ckpt", marker)
    with pytest.raises(safe_dcp.UnsafeCheckpointError) as err:
        safe_dcp.load({"model": dict(torch.nn.Linear(3, 2).state_dict())}, checkpoint_id=tmp_path / "ckpt")
    assert isinstance(err.value, UsageError) and "\n" not in str(err.value)
    assert str(meta) in str(err.value) and "posix.system" in str(err.value)
    assert not marker.exists()
    # the payload is real: torch's own reader runs it
    with open(meta, "rb") as f:
        pickle.load(f)  # noqa: S301 — the point of the test
    assert marker.exists()


def test_a_planted_value_in_a_shard_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _small_dcp(tmp_path / "ckpt", extra=_Payload(marker))  # a non-tensor value: torch.save'd into the shard file
    state = {"model": dict(torch.nn.Linear(3, 2).state_dict()), "extra": None}
    with pytest.raises(safe_dcp.UnsafeCheckpointError, match=r"ckpt: refused to read the value of 'extra'"):
        safe_dcp.load(state, checkpoint_id=tmp_path / "ckpt")
    assert not marker.exists()


def test_an_index_naming_files_outside_its_folder_is_refused(tmp_path: Path) -> None:
    _small_dcp(tmp_path / "ckpt")
    meta = safe_dcp.read_metadata(tmp_path / "ckpt")
    for info in meta.storage_data.values():
        info.relative_path = "../elsewhere.distcp"
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(safe_dcp.UnsafeCheckpointError, match="lies outside its folder"):
        safe_dcp.read_metadata(tmp_path / "ckpt")


def test_a_genuine_dcp_checkpoint_loads(tmp_path: Path) -> None:
    saved = _small_dcp(tmp_path / "ckpt", step={"lr": 0.5, "betas": (0.9, 0.99), "params": ["w", "b"]})
    state = {"model": dict(torch.nn.Linear(3, 2).state_dict()), "step": {"lr": 0.0, "betas": (0, 0), "params": []}}
    safe_dcp.load(state, checkpoint_id=tmp_path / "ckpt")
    assert all(torch.equal(state["model"][k], saved[k]) for k in saved)
    assert state["step"] == {"lr": 0.5, "betas": (0.9, 0.99), "params": ["w", "b"]}


def test_the_rendezvous_store_listens_on_loopback_only() -> None:
    port = free_port()
    store = rendezvous_store(f"tcp://127.0.0.1:{port}", 0, 1, timedelta(seconds=30))
    try:
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0 / ::
    finally:
        del store
    assert _listening(port) == []


@pytest.fixture(scope="module")
def sharded_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A real 2-rank FSDP2 learner (gloo): the addresses its ranks listen on, and its DCP checkpoint."""
    from divopd.learn.learner import LearnerConfig
    from divopd.learn.sharded import ShardedLearner
    from test_learner import WORDS, build_model, build_tokenizer, make_turns

    out = tmp_path_factory.mktemp("sharded")
    tok = build_tokenizer([WORDS], kind="word")
    turns = make_turns(tok, build_model(tok, "0.2m", seed=100), n=6)
    build_model(tok, "0.2m", seed=0).save_pretrained(out / "m")
    tok.save_pretrained(out / "m")
    cfg = LearnerConfig(lr=LR, world_size=2)
    two = ShardedLearner(str(out / "m"), cfg)
    try:
        rank0_sockets = _sockets_of(two.ranks.pids[0])
        two.step(turns)
        two.save_checkpoint(out / "ckpt")
        expected = two.step(turns)["learner/loss"]
    finally:
        two.close()
    return {"dir": out, "cfg": cfg, "turns": turns, "expected": expected, "rank0_sockets": rank0_sockets}


def _sockets_of(pid: int) -> list[str]:
    """The listening TCP addresses (hex, with port) of the sockets process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                found.append(fields[1])
    return found


def test_rank_0_serves_the_rendezvous_on_loopback_only(sharded_checkpoint: dict) -> None:
    listening = sharded_checkpoint["rank0_sockets"]
    assert listening, "rank 0 serves the rendezvous store"
    assert all(addr.startswith("0100007F:") for addr in listening), listening


def test_a_sharded_checkpoint_resumes_on_one_process_through_the_safe_reader(sharded_checkpoint: dict) -> None:
    from divopd.learn.learner import Learner

    ckpt, cfg, turns = sharded_checkpoint["dir"] / "ckpt", sharded_checkpoint["cfg"], sharded_checkpoint["turns"]
    one, _ = Learner.from_checkpoint(ckpt, cfg.model_copy(update={"world_size": 1}))
    assert abs(one.step(turns)["learner/loss"] - sharded_checkpoint["expected"]) <= 1e-4


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_on_two_ranks_through_the_safe_reader(sharded_checkpoint: dict) -> None:
    from divopd.learn.sharded import ShardedLearner

    ckpt, cfg, turns = sharded_checkpoint["dir"] / "ckpt", sharded_checkpoint["cfg"], sharded_checkpoint["turns"]
    two, _ = ShardedLearner.from_checkpoint(ckpt, cfg)
    try:
        assert abs(two.step(turns)["learner/loss"] - sharded_checkpoint["expected"]) <= 1e-4
    finally:
        two.close()


def test_a_planted_sharded_checkpoint_is_refused_on_resume(sharded_checkpoint: dict, tmp_path: Path) -> None:
    import shutil

    from divopd.learn.learner import Learner
    from divopd.learn.sharded import ShardedLearner

    ckpt = tmp_path / "ckpt"
    shutil.copytree(sharded_checkpoint["dir"] / "ckpt", ckpt)
    marker = tmp_path / "ran"
    meta = _plant(ckpt / "dcp", marker)
    cfg = sharded_checkpoint["cfg"]
    for resume in (lambda: ShardedLearner.from_checkpoint(ckpt, cfg),
                   lambda: Learner.from_checkpoint(ckpt, cfg.model_copy(update={"world_size": 1}))):
        with pytest.raises(safe_dcp.UnsafeCheckpointError, match=str(meta)):
            resume()
    assert not marker.exists()
