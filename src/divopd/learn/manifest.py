"""A checkpoint's manifest (written last: every file's size and a cheap hash of its ends) and its verification before
a resume trusts it. No torch: ``divopd train`` uses it at start.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_NAME", "DCP_DIR", "MANIFEST_FILE", "OPTIMIZER_FILE", "STATE_FILE", "checkpoint_dirs",
           "file_digest", "verify_checkpoint", "write_manifest"]

STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
#: A sharded checkpoint's model and optimizer shards (``torch.distributed.checkpoint``)
DCP_DIR = "dcp"
MANIFEST_FILE = "manifest.json"
#: ``state.json`` ``format`` of a checkpoint written by N learner ranks
SHARDED_FORMAT = 2
MANIFEST_FORMAT = "divopd-checkpoint-manifest-v1"
_EDGE = 1 << 20  # bytes hashed at each end of a file


#: The name of a checkpoint divopd writes into a run's ``checkpoints/`` (the learner version, 6 digits or more).
CHECKPOINT_NAME = re.compile(r"update-(\d{6,})")


def checkpoint_dirs(checkpoints_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints divopd wrote under ``checkpoints_dir``, oldest first: folders named exactly ``update-NNNNNN``
    holding a ``manifest.json`` or ``state.json``. Anything else is never listed, never pruned."""
    d = Path(checkpoints_dir)
    if not d.is_dir():
        return []
    found = []
    for sub in d.iterdir():
        m = CHECKPOINT_NAME.fullmatch(sub.name)
        if m and sub.is_dir() and not sub.is_symlink() and ((sub / MANIFEST_FILE).is_file()
                                                            or (sub / STATE_FILE).is_file()):
            found.append((int(m.group(1)), sub))
    return [p for _, p in sorted(found)]


def file_digest(path: str | os.PathLike) -> str:
    """The manifest's cheap hash of a file: BLAKE2b (16 bytes) over its size, its first and its last MiB."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as f:
        if size <= 2 * _EDGE:
            h.update(f.read())
        else:
            h.update(f.read(_EDGE))
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()


def write_manifest(folder: str | os.PathLike) -> Path:
    """Write ``manifest.json`` into ``folder`` listing every other file under it (size and :func:`file_digest`)."""
    d = Path(folder)
    files = {}
    for f in sorted(d.rglob("*")):
        if f.is_file() and f.name != MANIFEST_FILE:
            files[f.relative_to(d).as_posix()] = {"size": f.stat().st_size, "blake2b": file_digest(f)}
    out = d / MANIFEST_FILE
    out.write_text(json.dumps({"format": MANIFEST_FORMAT, "hash": "blake2b-16 of size, first and last MiB",
                               "files": files}, indent=1))
    return out


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """What is damaged in the checkpoint directory ``path`` (one line naming the file), or ``None`` if it verifies."""
    d = Path(path)
    if not d.is_dir():
        return "not a folder"
    manifest = d / MANIFEST_FILE
    if manifest.exists():
        problem = _check_manifest(d, manifest)
        if problem is not None:
            return problem
    state = _read_json(d / STATE_FILE)
    if isinstance(state, str):
        return state
    try:
        int(state["learner"]["version"])
    except (KeyError, TypeError, ValueError):
        return f"{STATE_FILE}: no learner version"
    if manifest.exists():
        return None
    return _check_without_manifest(d, state)


def _check_manifest(d: Path, manifest: Path) -> str | None:
    data = _read_json(manifest)
    if isinstance(data, str):
        return data
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST_FILE}: lists no files"
    for name, entry in files.items():
        f = d / name
        if not f.is_file():
            return f"{name}: missing"
        size = f.stat().st_size
        if size != entry.get("size"):
            return f"{name}: {size} bytes, {entry.get('size')} written"
        if file_digest(f) != entry.get("blake2b"):
            return f"{name}: contents differ from those written (hash)"
    return None


def _read_json(f: Path) -> Any:
    """The parsed file, or a one-line problem (a string) when it is missing or not JSON."""
    if not f.is_file():
        return f"{f.name}: missing"
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{f.name}: not readable JSON ({str(exc).splitlines()[0][:80]})"


def _check_without_manifest(d: Path, state: dict[str, Any]) -> str | None:
    """A checkpoint written before manifests: check each file as far as its format allows."""
    config = _read_json(d / "config.json")
    if isinstance(config, str):
        return config
    weights = sorted(d.glob("*.safetensors"))
    if not weights:
        return "model.safetensors: missing"
    for f in weights:
        problem = _check_safetensors(f)
        if problem is not None:
            return problem
    if state.get("format") == SHARDED_FORMAT or (d / DCP_DIR).is_dir():
        if not (d / DCP_DIR / ".metadata").is_file():
            return f"{DCP_DIR}/.metadata: missing"
    else:
        opt = d / OPTIMIZER_FILE
        if not opt.is_file():
            return f"{OPTIMIZER_FILE}: missing"
        try:
            with zipfile.ZipFile(opt) as z:
                z.infolist()
        except (OSError, zipfile.BadZipFile) as exc:
            return f"{OPTIMIZER_FILE}: not a whole torch file ({exc})"
    if (d / "tokenizer_config.json").is_file():
        if not any((d / n).is_file() for n in ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")):
            return "tokenizer.json: missing (tokenizer_config.json is there)"
    return None


def _check_safetensors(f: Path) -> str | None:
    """A ``.safetensors`` file is as long as its header says (8-byte header length, JSON header, tensor data)."""
    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size - 8:
                return f"{f.name}: {size} bytes, shorter than its header"
            header = json.loads(fh.read(n))
    except (OSError, struct.error, ValueError) as exc:
        return f"{f.name}: unreadable header ({exc})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"{f.name}: {size} bytes, {8 + n + end} expected from its header"
    return None
