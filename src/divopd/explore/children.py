"""The child processes divopd starts, and a terminal's Ctrl-C (SIGINT to the whole process group): children outlive
it, so divopd checkpoints before it stops them itself (a JVM gets a process group of its own instead)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["die_with_parent", "no_quit", "quit_deferred", "sigint_blocked"]

_PR_SET_PDEATHSIG = 1


@contextlib.contextmanager
def sigint_blocked(multiprocessing: bool = False) -> Iterator[None]:
    """Block SIGINT in this thread while the body starts child processes (they inherit the mask; a SIGINT meanwhile
    is delivered when the block ends). ``multiprocessing``: start its resource tracker first (its first spawn would
    unblock SIGINT in the caller)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    if multiprocessing:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def die_with_parent(parent_pid: int) -> None:
    """In a child: be killed (SIGKILL) when the parent thread that started it dies; exit at once if the parent
    ``parent_pid`` is already gone. Linux only (elsewhere a no-op: the child's own pipe to the parent ends it)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(1)


_depth = 0  # main-thread calls under no_quit, nested
_deferred = False  # a force quit arrived during one of them


@contextlib.contextmanager
def no_quit() -> Iterator[None]:
    """In the main thread: a force quit (:func:`quit_deferred`) inside the body is raised as ``KeyboardInterrupt``
    when it ends, for a call that an interrupt at a random bytecode leaves broken (py4j's; each has a deadline). A
    third Ctrl-C quits at once even there. A no-op in other threads (they never receive signals)."""
    global _depth, _deferred
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _deferred:
            _deferred = False
            raise KeyboardInterrupt


def quit_deferred() -> bool:
    """Called by the signal handler (main thread) for a force quit: ``True`` when it is deferred to the end of a
    :func:`no_quit` body (the first time), ``False`` when it must be raised now."""
    global _deferred
    if _depth == 0 or _deferred:
        return False
    _deferred = True
    return True
