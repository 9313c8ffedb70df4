"""Atomic checkpoints and versioned weight handles. A checkpoint folder (``checkpoints/update-NNNNNN/``) holds the HF
model and tokenizer, ``optimizer.pt`` (tensors only), ``state.json`` (plain JSON) and, written last, ``manifest.json``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from divopd.experience.metrics import json_safe
from divopd.learn.manifest import (
    DCP_DIR,
    MANIFEST_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    checkpoint_dirs,
    verify_checkpoint,
    write_manifest,
)

__all__ = ["DCP_DIR", "MANIFEST_FILE", "OPTIMIZER_FILE", "STATE_FILE", "WeightHandle", "atomic_dir",
           "atomic_write_text", "checkpoint_dirs", "checkpoint_state_text", "is_tied", "latest_checkpoint",
           "learner_counters", "load_dcp_optimizer", "read_state", "remove_interrupted_writes", "restore_learner_state",
           "to_json_safe", "verify_checkpoint"]


@contextmanager
def atomic_dir(path: str | os.PathLike, manifest: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``path`` that replaces it by rename on success (the old one is moved
    aside and removed after); on an exception ``path`` is untouched. ``manifest``: write ``manifest.json`` last."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        if manifest:
            write_manifest(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            if old.exists():
                shutil.rmtree(old)
            os.rename(final, old)
        os.rename(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a torn one (a flushed
    temporary file renamed over it); on an exception ``path`` is untouched."""
    final = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(name, final)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


#: What an interrupted :func:`atomic_dir` write leaves in ``checkpoints/`` (:func:`remove_interrupted_writes`).
_TMP_CHECKPOINT = re.compile(r"\.(update-\d+)\.tmp-[A-Za-z0-9_]+")
_OLD_CHECKPOINT = re.compile(r"\.(update-\d+)\.old-\d+")


def remove_interrupted_writes(checkpoints_dir: str | os.PathLike) -> list[str]:
    """Clean up divopd's own leftovers of interrupted checkpoint writes in ``checkpoints_dir``; one line per action.
    ``.update-N.tmp-*`` folders go; a ``.update-N.old-PID`` folder becomes ``update-N`` again when that one is missing
    (the kill fell between :func:`atomic_dir`'s two renames), else goes."""
    d = Path(checkpoints_dir)
    done: list[str] = []
    if not d.is_dir():
        return done
    for sub in sorted(d.iterdir()):
        if not sub.is_dir() or sub.is_symlink():
            continue
        if _TMP_CHECKPOINT.fullmatch(sub.name):
            shutil.rmtree(sub)
            done.append(f"removed the unfinished checkpoint write {sub.name}")
        elif (m := _OLD_CHECKPOINT.fullmatch(sub.name)) is not None:
            final = d / m.group(1)
            if final.exists():
                shutil.rmtree(sub)
                done.append(f"removed {sub.name}, the replaced copy of {final.name}")
            else:
                os.rename(sub, final)
                done.append(f"restored {final.name} from {sub.name}")
    return done


def to_json_safe(obj: Any) -> Any:
    """``extra_state`` as JSON types (:func:`~divopd.experience.metrics.json_safe`, NaN and inf kept as floats);
    ``TypeError`` for anything else."""
    return json_safe(obj, nonfinite="keep", strict=True)


def learner_counters(learner: Any) -> dict[str, Any]:
    """A learner's ``state.json`` ``learner`` entry: its version, counters and depth statistics."""
    state: dict[str, Any] = {"version": learner.version, "tokens_total": learner.tokens_total,
                             "compute_s_total": learner.compute_s_total, "skipped_updates": learner.skipped_updates}
    if learner.depth_stats is not None:
        state["depth_disagreement"] = list(learner.depth_stats.published())
    return state


def checkpoint_state_text(learner: Any, fmt: int, extra_state: dict[str, Any] | None, **more: Any) -> str:
    """A learner checkpoint's ``state.json``: format ``fmt``, counters, config, torch RNG and ``extra_state``."""
    state = {"format": fmt, **more, "learner": learner_counters(learner),
             "config": learner.config.model_dump(mode="json"),
             "rng": {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")},
             "extra_state": to_json_safe(extra_state or {})}
    return json.dumps(state, allow_nan=True)


def restore_learner_state(learner: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Put a ``state.json``'s counters back into ``learner`` and the torch RNG; returns its ``extra_state``."""
    from divopd.learn.turnopd import DepthStats

    saved = state["learner"]
    learner.version = int(saved["version"])
    learner.tokens_total = int(saved["tokens_total"])
    learner.compute_s_total = float(saved["compute_s_total"])
    learner.skipped_updates = int(saved.get("skipped_updates", 0))
    if learner.depth_stats is not None:
        learner.depth_stats = DepthStats(saved.get("depth_disagreement", ()))
    rng = base64.b64decode(state["rng"]["torch"])
    torch.set_rng_state(torch.frombuffer(bytearray(rng), dtype=torch.uint8).clone())
    return state.get("extra_state", {})


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """``state.json`` of a checkpoint directory, with a clear error when it is not one."""
    f = Path(path) / STATE_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not a divopd checkpoint (no {STATE_FILE})")
    return json.loads(f.read_text())


def latest_checkpoint(checkpoints_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint under ``checkpoints_dir`` whose ``state.json`` reads, or ``None``."""
    for sub in reversed(checkpoint_dirs(checkpoints_dir)):
        try:
            int(read_state(sub)["learner"]["version"])
        except (KeyError, TypeError, ValueError, OSError):
            continue
        return sub
    return None


@dataclass
class WeightHandle:
    """A published snapshot of the learner's weights: a CPU ``state_dict`` copy or a saved HF folder ``path``; for a
    LoRA student (``adapter``: :func:`divopd.learn.lora.adapter_settings`) the adapter's tensors only."""

    #: learner version of these weights (number of updates applied)
    version: int
    state_dict: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    path: str | None = None
    #: the learner's per-turn-depth disagreement means (``learner.depth_stats``; TurnOPD's depth budget reads them)
    depth_disagreement: tuple[float | None, ...] | None = None
    adapter: dict[str, Any] | None = None

    def load_into(self, model: torch.nn.Module) -> torch.nn.Module:
        """Copy these weights into ``model`` (same architecture), in place, keeping its dtype and device."""
        if self.adapter is not None:  # a LoRA student: the adapter version (injected into model on first use)
            from divopd.learn.lora import apply_adapter, handle_adapter

            return apply_adapter(model, handle_adapter(self), self.adapter)
        if self.state_dict is not None:
            model.load_state_dict(self.state_dict, strict=True)
        elif self.path is not None:
            from safetensors.torch import load_file

            files = sorted(Path(self.path).glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"WeightHandle: no *.safetensors in {self.path}")
            state: dict[str, torch.Tensor] = {}
            for f in files:
                state.update(load_file(str(f)))
            missing, unexpected = model.load_state_dict(state, strict=False)
            # tied weights (lm_head = embeddings) are saved once; anything else missing is an error
            missing = [k for k in missing if not is_tied(model, k)]
            if missing or unexpected:
                raise ValueError(f"WeightHandle: weights at {self.path} do not fit the model "
                                 f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
        else:
            raise ValueError("WeightHandle has neither a state_dict nor a path")
        return model


def is_tied(model: torch.nn.Module, key: str) -> bool:
    """``key`` is the output embedding tied to the input embedding (saved once, under the input's name)."""
    out = getattr(model, "get_output_embeddings", lambda: None)()
    inp = getattr(model, "get_input_embeddings", lambda: None)()
    return out is not None and inp is not None and out.weight is inp.weight and key.endswith("lm_head.weight")


def load_dcp_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Read a sharded checkpoint's optimizer shards (``dcp/``) into a single-process learner's ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    from divopd.learn import safe_dcp as dcp  # the index and values read without unpickling code

    optim_state = get_optimizer_state_dict(model, optimizer)
    state = {"optim": optim_state}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optim"])
