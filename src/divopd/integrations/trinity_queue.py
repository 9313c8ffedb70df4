"""What the Trinity-RFT sample strategy asks of Trinity's queue actor (``QueueStorage``) beyond Trinity's own reader:
"read what is there" (Trinity's ``get_batch`` waits, in 1 s polls, for a whole read; its ``length()`` counts
payloads, not experiences).

``__ray_call__`` runs in a thread of Ray's beside the actor's asyncio event loop, where Trinity's queue lives; the
count only reads, and the read is handed to that loop (``asyncio.run_coroutine_threadsafe``), so the queue is only
ever changed from its own loop. The loop is the actor's one running event loop in another thread (found once, then
kept on the actor object); where there is not exactly one, the strategy reads the counted experiences with Trinity's
reader (a second round trip). The function is a closure so that Ray ships its code by value: the queue actor need not
import divopd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ReadNow", "read_now_function"]

#: ``(serialized experiences or None, experiences the queue held before the read, closed and empty)``
ReadNow = tuple[bytes | None, int, bool]


def read_now_function() -> Callable[[Any, int, float], ReadNow]:
    """``read_now(storage, limit, timeout)`` for ``__ray_call__`` on Trinity's ``QueueStorage`` actor: the count of
    experiences the queue holds (the unread rest of a payload in ``exp_pool`` plus the experiences of the queued
    payloads), and, when that is not 0 and the actor's event loop is known, the first ``min(count, limit)`` of them
    as Trinity's ``get_batch`` serializes them (``None`` otherwise: read them with Trinity's reader). ``timeout`` is
    the deadline of that read (it does not wait: the experiences are there, and this strategy is the only reader)."""

    def actor_loop(storage: Any) -> Any:
        import asyncio
        import gc
        import threading

        loop = storage.__dict__.get("_divopd_event_loop")
        if loop is None:
            me = threading.get_ident()
            running = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()
                       and getattr(o, "_thread_id", me) != me]
            loop = running[0] if len(running) == 1 else False  # False: not found, do not look again
            storage.__dict__["_divopd_event_loop"] = loop
        return loop or None

    def read_now(storage: Any, limit: int, timeout: float) -> ReadNow:
        import asyncio

        queue = storage.queue
        items = queue.qsize()  # payloads: a lower bound (a payload holds >= 1 experience)
        for _ in range(8):  # a writer may append while we look: look again
            try:
                items = sum(len(p) for p in list(getattr(queue, "_queue", ())))
                break
            except RuntimeError:
                continue
        available = len(storage.exp_pool) + max(items, queue.qsize())
        closed = queue.stopped()
        n = min(available, limit)
        loop = actor_loop(storage) if n > 0 else None
        if loop is None:
            return None, available, closed
        future = asyncio.run_coroutine_threadsafe(storage.get_batch(n, timeout=timeout), loop)
        try:
            return future.result(timeout=timeout + 30.0), available, closed
        except StopAsyncIteration:  # closed and empty (cannot happen with n counted, but Trinity may say so)
            return None, 0, True

    return read_now
