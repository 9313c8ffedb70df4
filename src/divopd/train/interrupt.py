"""Ctrl-C and SIGTERM as a stop request that the loop checks at its next stage boundary, never a
``KeyboardInterrupt`` at a random bytecode (inside a finalizer, an optimizer step, library code). A second Ctrl-C
raises at once (after a JVM call in progress: :func:`divopd.explore.children.no_quit`; a third even there).

:func:`fault_point` is the test hook: ``DIVOPD_SIGINT_AT=phase[:n]`` sends this process SIGINT the n-th time (default
1) the phase is reached; ``DIVOPD_SIGKILL_AT`` SIGKILL, ``DIVOPD_SIGSTOP_AT`` SIGSTOP (a test changes the world until
SIGCONT), ``DIVOPD_DOUBLE_CTRL_C_AT`` two SIGINTs 50 ms apart to the process group. Phases: :data:`KILL_PHASES`."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from types import FrameType, TracebackType

from divopd.explore.children import quit_deferred

__all__ = ["StopRequest", "fault_point", "PHASES", "KILL_PHASES", "EXIT_INTERRUPTED"]

log = logging.getLogger(__name__)

#: Exit code of a command stopped by SIGINT / SIGTERM (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = 130
#: ``load`` (before the models load), ``start`` (explorers built), ..., ``eval`` and ``checkpoint`` (inside one).
PHASES = ("load", "start", "compose", "update", "publish", "eval", "checkpoint")
#: Also ``poll`` (inside the lockstep runtime's poll) and ``log`` (turns received, before the log write).
KILL_PHASES = (*PHASES, "poll", "log")
_DOUBLE_ENV = "DIVOPD_DOUBLE_CTRL_C_AT"
#: Each test hook's environment variable and the signal it sends.
_HOOKS = (("DIVOPD_SIGINT_AT", signal.SIGINT), ("DIVOPD_SIGKILL_AT", signal.SIGKILL), (_DOUBLE_ENV, signal.SIGINT),
          ("DIVOPD_SIGSTOP_AT", signal.SIGSTOP))
#: Seconds between the two SIGINTs of ``DIVOPD_DOUBLE_CTRL_C_AT``.
DOUBLE_CTRL_C_GAP_S = 0.05
_reached: Counter[tuple[str, str]] = Counter()
_reached_lock = threading.Lock()


class StopRequest:
    """SIGINT / SIGTERM set :attr:`requested` inside the ``with`` block (handlers installed from the main thread
    only; :meth:`set` works anywhere)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def set(self, signum: int | None = None) -> None:
        self.signal = signum
        self._event.set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._event.is_set():  # a second Ctrl-C: stop now, wherever the run is (after a JVM call in progress)
            if quit_deferred():
                log.warning("%s received again: quitting once the current JVM call returns (Ctrl-C again: at once)",
                            signal.Signals(signum).name)
                return
            raise KeyboardInterrupt
        self.set(signum)
        log.warning("%s received: stopping at the next stage boundary (checkpoint, then exit %d); "
                    "press Ctrl-C again to quit at once", signal.Signals(signum).name, EXIT_INTERRUPTED)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()


def fault_point(phase: str) -> None:
    """Test hook: send the signal an env var names for ``phase`` (module docstring) the n-th time it is reached."""
    for env, sig in _HOOKS:
        spec = os.environ.get(env)
        if not spec:
            continue
        name, _, nth = spec.partition(":")
        if name != phase:
            continue
        with _reached_lock:
            _reached[(env, phase)] += 1
            hit = _reached[(env, phase)] == (int(nth) if nth else 1)
        if hit and env == _DOUBLE_ENV:
            log.info("fault point %r: sending SIGINT twice to the process group", phase)
            os.killpg(os.getpgrp(), sig)
            time.sleep(DOUBLE_CTRL_C_GAP_S)
            os.killpg(os.getpgrp(), sig)
        elif hit:
            log.info("fault point %r: sending %s to this process", phase, sig.name)
            os.kill(os.getpid(), sig)
