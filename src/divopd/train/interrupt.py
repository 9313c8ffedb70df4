"""Ctrl-C and SIGTERM as a stop request that the training loop checks, never an exception at a random bytecode.

Why a flag: Python runs a signal handler between two bytecodes of the main thread. The default SIGINT handler raises
``KeyboardInterrupt`` there, which can land inside a finalizer (``__del__``, a weakref callback: the exception is
printed as "ignored" and the run goes on to report success), half-way through an optimizer step, or inside library
code that catches ``BaseException``. :class:`StopRequest` only records the request; the loop stops at its next
stage boundary, checkpoints and the command exits with 130. A second Ctrl-C raises ``KeyboardInterrupt`` at once
(force quit, for a phase that hangs): the loop then checkpoints only if it was at a stage boundary, else the newest
checkpoint stays the one to resume from; inside a JVM call the quit waits for the call's end
(:func:`divopd.explore.children.no_quit`), a third Ctrl-C quits even there. A terminal's Ctrl-C reaches every process
of the group: the children divopd starts are kept out of its way and stopped by divopd (:mod:`divopd.explore.children`).

:func:`fault_point` is the test hook that makes every phase testable: ``DIVOPD_SIGINT_AT=phase[:n]`` sends this
process SIGINT the n-th time (default 1) the named phase is reached, ``DIVOPD_SIGKILL_AT=phase[:n]`` SIGKILL (a ``kill
-9`` at a known moment), ``DIVOPD_DOUBLE_CTRL_C_AT=phase[:n]`` two SIGINTs 50 ms apart to the whole process group (an
impatient double Ctrl-C in a terminal), ``DIVOPD_SIGSTOP_AT=phase[:n]`` SIGSTOP (the process pauses there until a
SIGCONT: a test changes the world, e.g. fills the disk, at a known moment). Phases: ``load`` (before the models load),
``start`` (explorers built, before the loop), ``compose``, ``update``, ``publish``, ``eval`` (inside an evaluation),
``checkpoint`` (inside a checkpoint write); and (:data:`KILL_PHASES`) ``poll`` (inside the lockstep runtime's poll,
after each explorer's round) and ``log`` (turns received, before they are written to the experience log).
"""

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
PHASES = ("load", "start", "compose", "update", "publish", "eval", "checkpoint")
#: Phases a kill test also reaches (the lockstep runtime's poll, the experience log write).
KILL_PHASES = (*PHASES, "poll", "log")
_ENV = "DIVOPD_SIGINT_AT"
_KILL_ENV = "DIVOPD_SIGKILL_AT"
_STOP_ENV = "DIVOPD_SIGSTOP_AT"
_DOUBLE_ENV = "DIVOPD_DOUBLE_CTRL_C_AT"
#: Seconds between the two SIGINTs of ``DIVOPD_DOUBLE_CTRL_C_AT``.
DOUBLE_CTRL_C_GAP_S = 0.05
_reached: Counter[tuple[str, str]] = Counter()
_reached_lock = threading.Lock()


class StopRequest:
    """SIGINT / SIGTERM set :attr:`requested`; use as a context manager around a run (restores the old handlers).

    Only the main thread can install handlers; elsewhere the request can still be set with :meth:`set`.
    """

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
    """Test hook: with ``DIVOPD_SIGINT_AT=phase[:n]`` (``DIVOPD_SIGKILL_AT``, ``DIVOPD_SIGSTOP_AT``), send this
    process SIGINT (SIGKILL, SIGSTOP) the n-th time ``phase`` is reached."""
    for env, sig in ((_ENV, signal.SIGINT), (_KILL_ENV, signal.SIGKILL), (_DOUBLE_ENV, signal.SIGINT),
                     (_STOP_ENV, signal.SIGSTOP)):
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


def reset_fault_points() -> None:
    """Forget how often each phase was reached (tests that run several commands in one process)."""
    with _reached_lock:
        _reached.clear()
