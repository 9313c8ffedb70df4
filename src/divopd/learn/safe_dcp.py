"""Read a sharded checkpoint's ``dcp/`` folder without executing code from it (``torch.distributed.checkpoint`` reads
its index and non-tensor values with ``pickle``): a refused file raises :class:`UnsafeCheckpointError`, one line
naming the file. Use it as ``from divopd.learn import safe_dcp as dcp``.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path, PurePath
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from divopd.errors import UsageError

__all__ = ["ALLOWED_GLOBALS", "SafeFileSystemReader", "SafeLoadPlanner", "SafeMetadataUnpickler",
           "UnsafeCheckpointError", "load", "read_metadata"]

METADATA_FILE = ".metadata"

#: The globals a torch 2.13 DCP ``.metadata`` pickle references (model + AdamW state of an FSDP2 learner), plus
#: ``torch.<dtype>`` and ``torch.<layout>`` objects, which :meth:`SafeMetadataUnpickler.find_class` allows by type.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a layout by its name, from a fixed table of torch.layout objects
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
})


class UnsafeCheckpointError(UsageError, ValueError):
    """A checkpoint file that divopd will not read: it would run code, or it is not a DCP index."""


class SafeMetadataUnpickler(pickle.Unpickler):
    """An unpickler for a DCP index (``.metadata``) that builds only :data:`ALLOWED_GLOBALS` and torch dtypes and
    layouts; any other global, and any persistent id, is refused before it is looked up, so nothing in the file runs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it references {module}.{name}, which is not a DCP metadata class")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent id, which a DCP index does not use")


def _check_storage(metadata: Metadata, path: Path) -> None:
    """Every shard file the index names is a plain file name inside the checkpoint folder."""
    for info in (metadata.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or PurePath(rel).name != rel or rel in (".", ".."):
            raise UnsafeCheckpointError(f"{path}: not a usable DCP checkpoint index: a shard file named {rel!r} "
                                        "lies outside its folder")


def _read_index(file: Path) -> Metadata:
    """One ``.metadata`` file rebuilt by :class:`SafeMetadataUnpickler` and checked (``FileNotFoundError`` passes)."""
    try:
        with open(file, "rb") as f:
            metadata = SafeMetadataUnpickler(f).load()
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 — any failure to rebuild the index is a refusal, with its reason
        raise UnsafeCheckpointError(f"{file}: refused to read this checkpoint index: {exc}") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{file}: not a DCP checkpoint index (it holds a {type(metadata).__name__})")
    _check_storage(metadata, file)
    return metadata


def read_metadata(folder: str | Path) -> Metadata:
    """The DCP index of ``folder``, read without running code, else :class:`UnsafeCheckpointError`."""
    file = Path(folder) / METADATA_FILE
    try:
        return _read_index(file)
    except FileNotFoundError:
        raise UnsafeCheckpointError(f"{file}: the sharded checkpoint has no DCP index (.metadata)") from None


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` rebuilds the index without ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = _read_index(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads non-tensor values (optimizer ``param_groups``) with ``weights_only=True``."""

    def __init__(self, checkpoint: str | Path) -> None:
        super().__init__()
        self.checkpoint = str(checkpoint)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(f"{self.checkpoint}: refused to read the value of "
                                        f"{read_item.dest_index.fqn!r}: {exc}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load(state_dict: dict[str, Any], *, checkpoint_id: str | Path) -> None:
    """``torch.distributed.checkpoint.load(state_dict, checkpoint_id=...)`` without unpickling code."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    read_metadata(checkpoint_id)  # a refusal here is one line, before DCP wraps it into its own exception
    reader = SafeFileSystemReader(checkpoint_id)
    try:
        dcp.load(state_dict, storage_reader=reader, planner=SafeLoadPlanner(checkpoint_id))
    except CheckpointException as exc:
        for failure, _trace in exc.failures.values():
            if isinstance(failure, UnsafeCheckpointError):
                raise failure from None
        raise
