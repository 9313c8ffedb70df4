"""A deadline on a call that Python cannot interrupt (an in-process vLLM engine call): :func:`call_deadline`."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["EXIT_CALL_STALLED", "call_deadline"]

log = logging.getLogger(__name__)

#: Exit code of a process whose main thread stayed blocked in a call past twice its deadline (the same as
#: ``divopd.train.watchdog.EXIT_STALLED``: the run stalled).
EXIT_CALL_STALLED = 3


@contextmanager
def call_deadline(timeout_s: float, line: str, mark: Callable[[str | None], None]) -> Iterator[None]:
    """Run the body under the deadline ``timeout_s``: past it ``mark(line)`` (stalled, for the loop watchdog) and log
    ``line``; ``mark(None)`` when the body ends. From the main thread (whose watchdog the call blocks), past twice the
    deadline, exit the process with one line and :data:`EXIT_CALL_STALLED` (``--resume`` continues)."""
    timers: list[threading.Timer] = []
    on_main = threading.current_thread() is threading.main_thread()

    def start(action: Callable[[], None]) -> None:
        timer = threading.Timer(timeout_s, action)
        timer.daemon = True
        timers.append(timer)
        timer.start()

    def overdue() -> None:
        mark(line)
        log.error("%s (the call cannot be interrupted; the loop watchdog stops the run)", line)
        if on_main:
            start(abandon)

    def abandon() -> None:
        os.write(2, (f"divopd: {line}, nor in another {timeout_s:g} s; the run's own thread is blocked in it, so the "
                     "process exits (the newest checkpoint stays: fix the cause and --resume)\n").encode())
        os._exit(EXIT_CALL_STALLED)

    start(overdue)
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        mark(None)
