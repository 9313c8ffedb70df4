"""What the Trinity-RFT sample strategy asks of Trinity's queue actor (``QueueStorage``) beyond Trinity's own reader:
count and read what is there without waiting, leaving the records that arrived stale unserialized.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ReadNow", "StaleHeader", "read_now_function"]

#: A record left unserialized because it arrived stale: ``(position in the read, rollout id, turn index, policy
#: version, info["task"] or eid.tid)``.
StaleHeader = tuple[int, str, int, int, Any]
#: ``(serialized experiences or None, the stale records' headers, experiences the queue held before the read,
#: closed and empty)``
ReadNow = tuple[bytes | None, list[StaleHeader], int, bool]


def read_now_function(version_key: str) -> Callable[..., ReadNow]:
    """``read_now(storage, limit, timeout, stale_below=None)`` for ``__ray_call__`` on Trinity's ``QueueStorage``
    actor (a closure: Ray ships its code by value): the count of experiences the queue holds, and, when that is not 0
    and the actor's event loop is known, the next ``min(count, limit)`` of them serialized as by Trinity's
    ``get_batch`` (``None`` otherwise: read them with Trinity's reader). With ``stale_below``, a readable record whose
    policy version (``info[version_key]``, else ``info["model_version"]``) is an int in ``[0, stale_below)`` is taken
    unserialized: only its :data:`StaleHeader` comes back, not counted towards ``limit``. ``timeout``: the take's.

    ``__ray_call__`` runs in a Ray thread: the count only reads, and the take runs on the actor's one running event
    loop in another thread (found once), so only that loop changes the queue."""

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

    def stale_header(position: int, exp: Any, stale_below: int) -> StaleHeader | None:
        eid, info = exp.eid, exp.info
        if eid is None or type(info) is not dict or (eid.batch in ("", None) and eid.task in ("", None)):
            return None
        version = info.get(version_key, info.get("model_version"))
        if type(version) is not int or not 0 <= version < stale_below or type(eid.step) is not int or eid.step < 0:
            return None
        return position, eid.rid, eid.step, version, info.get("task", eid.tid)

    async def take(storage: Any, n: int, most: int, timeout: float, stale_below: int | None
                   ) -> tuple[list[Any], list[StaleHeader]]:
        """The next records, in order (as Trinity's ``get_batch``: a payload's rest stays in ``exp_pool``), until ``n``
        are not stale or ``most`` are taken: the experiences, and the stale records' headers."""
        import asyncio

        pool, taken, stale = storage.exp_pool, [], []
        while len(taken) < n and len(taken) + len(stale) < most:
            if not pool:
                pool.extend(await asyncio.wait_for(storage.queue.get(), timeout))
                continue
            exp = pool.popleft()
            head = None if stale_below is None else stale_header(len(taken) + len(stale), exp, stale_below)
            if head is None:
                taken.append(exp)
            else:
                stale.append(head)
        return taken, stale

    def read_now(storage: Any, limit: int, timeout: float, stale_below: int | None = None) -> ReadNow:
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
            return None, [], available, closed
        future = asyncio.run_coroutine_threadsafe(take(storage, n, available, timeout, stale_below), loop)
        try:
            taken, stale = future.result(timeout=timeout + 30.0)
        except StopAsyncIteration:  # closed and empty (cannot happen with n counted, but Trinity may say so)
            return None, [], 0, True
        data = type(taken[0]).serialize_many(taken) if taken else None
        return data, stale, available, closed

    return read_now
