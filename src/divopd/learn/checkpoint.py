"""Atomic checkpoints and versioned weight handles.

A checkpoint directory (the run-dir layout: ``checkpoints/update-NNNNNN/``) holds:

* the model in Hugging Face format (``config.json``, ``model.safetensors``, ...) and the tokenizer when given,
* ``optimizer.pt`` — the optimizer ``state_dict`` (tensors only; loaded with ``weights_only=True``),
* ``state.json`` — learner version, counters, the learner config, the torch RNG state, and ``extra_state`` (e.g. the
  sampler's ``state_dict``) as plain JSON: never pickle,
* ``manifest.json`` — written last: every file with its size and a cheap hash, which a resume verifies before it
  trusts the checkpoint (:mod:`divopd.learn.manifest`).

Only folders named exactly ``update-NNNNNN`` holding divopd's files are checkpoints (:func:`checkpoint_dirs`);
anything else a user puts in ``checkpoints/`` is never listed nor pruned.

It is written to a temporary sibling directory and renamed into place, so a reader never sees a half-written
checkpoint: a crash leaves either the previous checkpoint or the new one (plus a ``.update-N.tmp-*`` directory, which
:func:`remove_interrupted_writes` removes at the next start). Single files a later run trusts (``summary.json``,
``config.yaml``) are written the same way by :func:`atomic_write_text`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from divopd.learn.manifest import (
    DCP_DIR,
    MANIFEST_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    checkpoint_dirs,
    verify_checkpoint,
    write_manifest,
)

__all__ = [
    "DCP_DIR",
    "MANIFEST_FILE",
    "OPTIMIZER_FILE",
    "STATE_FILE",
    "WeightHandle",
    "atomic_dir",
    "atomic_write_text",
    "decode_rng_state",
    "encode_rng_state",
    "checkpoint_dirs",
    "latest_checkpoint",
    "load_dcp_optimizer",
    "read_state",
    "remove_interrupted_writes",
    "to_json_safe",
    "verify_checkpoint",
]



@contextmanager
def atomic_dir(path: str | os.PathLike, manifest: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory next to ``path``; on success it replaces ``path`` by rename.

    An existing ``path`` is moved aside first and removed only after the new directory is in place. On an exception
    the temporary directory is removed and ``path`` is untouched. ``manifest``: write ``manifest.json`` (every file,
    its size and hash: :func:`divopd.learn.manifest.write_manifest`) last, before the rename (checkpoints).
    """
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
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a torn one: a temporary
    file in the same folder, flushed to disk, then renamed over ``path``. On an exception the temporary file is
    removed and ``path`` is untouched."""
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


#: What an interrupted :func:`atomic_dir` write of a run's checkpoint leaves in ``checkpoints/``: the new
#: checkpoint being written (``.update-N.tmp-*``, from :func:`tempfile.mkdtemp`) and the old one moved aside
#: (``.update-N.old-PID``, present only between the two renames).
_TMP_CHECKPOINT = re.compile(r"\.(update-\d+)\.tmp-[A-Za-z0-9_]+")
_OLD_CHECKPOINT = re.compile(r"\.(update-\d+)\.old-\d+")


def remove_interrupted_writes(checkpoints_dir: str | os.PathLike) -> list[str]:
    """Clean up after checkpoint writes a crash or ``kill -9`` interrupted; returns what was done, one line each.

    Only divopd's own leftovers directly inside ``checkpoints_dir`` are touched: ``.update-N.tmp-*`` folders are
    removed; a ``.update-N.old-PID`` folder is renamed back to ``update-N`` when that one is missing (the kill fell
    between :func:`atomic_dir`'s two renames: it is the last complete copy), else removed."""
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
    """Convert numpy scalars/arrays and tuples to plain JSON types (non-finite floats stay floats: the file is written
    with ``allow_nan=True`` and Python's ``json`` reads NaN/Infinity back); raise ``TypeError`` naming the offending
    type for anything else (no pickle fallback)."""
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): to_json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_json_safe(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj)
    if obj is None or isinstance(obj, str):
        return obj
    raise TypeError(f"checkpoint extra_state: cannot store a {type(obj).__name__} as JSON")


def encode_rng_state(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_rng_state(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """``state.json`` of a checkpoint directory, with a clear error when it is not one."""
    f = Path(path) / STATE_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not a divopd checkpoint (no {STATE_FILE})")
    return json.loads(f.read_text())


def latest_checkpoint(checkpoints_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint under ``checkpoints_dir`` whose ``state.json`` reads (``None`` if none); a resume
    verifies it first (:func:`divopd.train.checkpoints.resume_checkpoint`)."""
    for sub in reversed(checkpoint_dirs(checkpoints_dir)):
        try:
            int(read_state(sub)["learner"]["version"])
        except (KeyError, TypeError, ValueError, OSError):
            continue
        return sub
    return None


@dataclass
class WeightHandle:
    """A published snapshot of the learner's weights, for explorers to load at their own pace.

    Attributes:
        version: learner version of these weights (number of updates applied).
        state_dict: a CPU copy of the model's ``state_dict`` (in-process and Ray object-ref publication), or ``None``.
        path: a saved HF model folder holding the weights, or ``None``.
        depth_disagreement: the learner's running per-turn-depth disagreement means published with these weights
            (``learner.depth_stats``; TurnOPD's depth budget reads them), or ``None``.
        adapter: a LoRA student's adapter settings (:func:`divopd.learn.lora.adapter_settings`): ``state_dict`` /
            ``path`` then hold the adapter's tensors only; ``None`` = the whole model.
    """

    version: int
    state_dict: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    path: str | None = None
    depth_disagreement: tuple[float | None, ...] | None = None
    adapter: dict[str, Any] | None = None

    def load_into(self, model: torch.nn.Module) -> torch.nn.Module:
        """Copy these weights into ``model`` (same architecture), in place, keeping its dtype and device."""
        if self.adapter is not None:  # a LoRA student: the adapter version (injected into model on first use)
            from divopd.learn.lora import apply_adapter, read_adapter

            state = self.state_dict if self.state_dict is not None else read_adapter(str(self.path))[0]
            return apply_adapter(model, state, self.adapter)
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
            missing = [k for k in missing if not _is_tied(model, k)]
            if missing or unexpected:
                raise ValueError(f"WeightHandle: weights at {self.path} do not fit the model "
                                 f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
        else:
            raise ValueError("WeightHandle has neither a state_dict nor a path")
        return model


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    out = getattr(model, "get_output_embeddings", lambda: None)()
    inp = getattr(model, "get_input_embeddings", lambda: None)()
    return out is not None and inp is not None and out.weight is inp.weight and key.endswith("lm_head.weight")


def copy_state_dict(model: torch.nn.Module, transform: Callable[[torch.Tensor], torch.Tensor] | None = None
                    ) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``model.state_dict()`` (optionally transformed, e.g. cast)."""
    out = {}
    for k, v in model.state_dict().items():
        t = v.detach().to("cpu", copy=True)
        out[k] = transform(t) if transform else t
    return out


def load_dcp_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """The single-process learner resuming a sharded checkpoint: read its optimizer shards (``dcp/``) into
    ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    from divopd.learn import safe_dcp as dcp  # the index and values read without unpickling code

    optim_state = get_optimizer_state_dict(model, optimizer)
    state = {"optim": optim_state}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optim"])
