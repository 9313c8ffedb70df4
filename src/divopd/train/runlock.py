"""One process writes a run directory at a time: an ``fcntl.flock`` on ``RUN_DIR/.divopd-lock`` (never stale: the
kernel drops it with the process), holding the holder's pid and host for the one-line refusal. No lock off POSIX."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from divopd.errors import UsageError

__all__ = ["LOCK", "RunLockedError", "lock_run_dir", "release_run_dir", "run_lock"]

#: The lock file a writing process holds inside its run directory.
LOCK = ".divopd-lock"

_HELD: dict[str, int] = {}  # resolved run directory -> the open lock file of this process


class RunLockedError(UsageError):
    """Another process holds the run directory's lock (a run or a resume writing it)."""


def _key(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock (the directory must exist) while the block runs (nested: the outermost lets it go);
    :class:`RunLockedError` when another process holds it."""
    taken = lock_run_dir(run_dir)
    try:
        yield
    finally:
        if taken:
            release_run_dir(run_dir)


def lock_run_dir(run_dir: Path) -> bool:
    """Take ``run_dir``'s lock for this process, or raise :class:`RunLockedError` naming the holder's pid; returns
    whether this call took it (``False``: this process holds it already, or there is no ``flock``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no OS lock to take
        return False
    key = _key(run_dir)
    if key in _HELD:
        return False
    fd = os.open(Path(run_dir) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        os.close(fd)
        raise RunLockedError(f"{run_dir} is in use by another divopd process ({holder}), which is writing this run; "
                             "wait for it to end (or stop it with Ctrl-C), then run the command again") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _HELD[key] = fd
    return True


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text:
            return text
    return "pid unknown: it is starting"


def release_run_dir(run_dir: Path) -> None:
    """Let ``run_dir``'s lock go (its run's files are closed); a no-op if this process does not hold it."""
    fd = _HELD.pop(_key(run_dir), None)
    if fd is not None:
        os.close(fd)  # closing the file releases the flock
