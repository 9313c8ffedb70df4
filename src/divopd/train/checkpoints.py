"""A run's ``checkpoints/`` folder: the checkpoint a resume trusts, pruning (only divopd's own), and a failed write (a
full disk) as one line, the newest good checkpoint kept, exit :data:`EXIT_CHECKPOINT_WRITE`."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from divopd.errors import UsageError
from divopd.learn.manifest import checkpoint_dirs, verify_checkpoint  # no torch: divopd train imports it

__all__ = ["DAMAGED_SUFFIX", "EXIT_CHECKPOINT_WRITE", "CheckpointWriteError", "checkpoint_write", "disk_full_line",
           "is_disk_full", "prune_checkpoints", "resume_checkpoint", "unused_path"]

log = logging.getLogger(__name__)

#: Exit code of ``divopd train`` when a checkpoint could not be written (the stall watchdog's code, 3).
EXIT_CHECKPOINT_WRITE = 3
#: What a damaged checkpoint is renamed to when a resume falls back past it.
DAMAGED_SUFFIX = ".damaged"


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (``OSError``: disk full, quota, I/O); the message is one line."""


_FULL_TEXT = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), f"os error {errno.ENOSPC}")


def is_disk_full(exc: BaseException | None) -> bool:
    """``exc`` (or its cause) says the disk or quota is full: ``ENOSPC`` / ``EDQUOT``, or a library's error with
    that text (safetensors' ``... (os error 28)``)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(exc) for text in _FULL_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextmanager
def checkpoint_write(path: Path, run_dir: Path) -> Iterator[None]:
    """Around the write of checkpoint ``path``: an ``OSError`` or a full disk becomes a :class:`CheckpointWriteError`
    naming the newest good checkpoint (the atomic write has removed what it wrote)."""
    try:
        yield
    except Exception as exc:
        if not (isinstance(exc, OSError) or is_disk_full(exc)):
            raise
        kept = checkpoint_dirs(path.parent)
        newest = next((p.name for p in reversed(kept) if p.name != path.name), None)
        cause = "disk full" if is_disk_full(exc) else "write failed"
        where = getattr(exc, "filename", None) or path.parent
        detail = getattr(exc, "strerror", None) or os.strerror(errno.ENOSPC) if cause == "disk full" else exc
        raise CheckpointWriteError(
            f"checkpoint {path.name} could not be written ({cause}: {detail} on {where}); nothing partial is left, "
            f"the newest good checkpoint is {newest or 'none (the run resumes from its start)'}; free space, then "
            f"`divopd train --resume {run_dir}`") from exc


def disk_full_line(exc: BaseException, run_dir: str | Path) -> str:
    """The one line ``divopd train`` prints for a failed checkpoint write or a full disk anywhere in the run."""
    if isinstance(exc, CheckpointWriteError):
        return str(exc)
    kept = checkpoint_dirs(Path(run_dir) / "checkpoints")
    return (f"disk full ({getattr(exc, 'strerror', None) or exc} on {getattr(exc, 'filename', None) or run_dir}); "
            f"the newest good checkpoint is {kept[-1].name if kept else 'none (the run resumes from its start)'}; "
            f"free space, then `divopd train --resume {run_dir}`")


def prune_checkpoints(checkpoints_dir: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` of divopd's checkpoints in ``checkpoints_dir``; returns the kept ones."""
    ours = checkpoint_dirs(checkpoints_dir)
    for old in ours[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return ours[-keep:]


def resume_checkpoint(run_dir: Path, flag: str = "--resume") -> Path | None:
    """The newest checkpoint of ``run_dir`` that verifies (``None``: none at all); newer ones are set aside as
    ``*.damaged`` with one warning. None verifies: one-line :class:`UsageError`, nothing changed."""
    ours = checkpoint_dirs(Path(run_dir) / "checkpoints")
    if not ours:
        return None
    damaged: list[tuple[Path, str]] = []
    chosen = None
    for ckpt in reversed(ours):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            chosen = ckpt
            break
        damaged.append((ckpt, problem))
    what = "; ".join(f"{p.name} ({problem})" for p, problem in damaged)
    if chosen is None:
        raise UsageError(f"{flag} {run_dir}: no checkpoint verifies ({what}); nothing was changed (metrics and "
                         "experience log kept); restore a checkpoint, or start a fresh run with another --run-dir")
    if damaged:
        moved = [_set_aside(p).name for p, _ in damaged]
        log.warning("resume: damaged checkpoint %s; set aside as %s; resuming from %s", what, ", ".join(moved),
                    chosen.name)
    return chosen


def _set_aside(ckpt: Path) -> Path:
    target = unused_path(ckpt.with_name(ckpt.name + DAMAGED_SUFFIX))
    os.rename(ckpt, target)
    return target


def unused_path(path: Path) -> Path:
    """``path``, or the first of ``path-2``, ``path-3``, ... that does not exist."""
    target = path
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}-{n}")
    return target
