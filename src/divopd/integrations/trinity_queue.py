"""What the Trinity-RFT sample strategy asks of Trinity's queue actor (``QueueStorage``) beyond Trinity's own reader:
count and read what is there without waiting; keep the records read in the actor until they are selected, sending
back only what the sampler reads of them; drop there the records that arrive stale.

The functions run in the actor through ``__ray_call__``. They are closures, so that Ray ships their code by value and
the actor needs no divopd; the strategy calls :func:`light_function`'s closure on its own side too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from trinity.common.experience import Experience

__all__ = ["Arrays", "KeptHeader", "LightHeader", "Packed", "ReadNow", "StaleHeader", "fetch_function",
           "light_function", "pack_function", "read_now_function", "unpack"]

#: What the sampler reads of a record without its arrays: ``(rollout id, turn index, policy version, prompt
#: truncated, info["task"] or eid.tid)``.
LightHeader = tuple[str, int, int, bool, Any]
#: A record left unserialized because it arrived stale: ``(position in the read, rollout id, turn index, policy
#: version, info["task"] or eid.tid)``.
StaleHeader = tuple[int, str, int, int, Any]
#: A record kept in the actor until it is selected: ``(position in the read, key, *LightHeader)``.
KeptHeader = tuple[int, int, str, int, int, bool, Any]
#: Response arrays of records, concatenated in order: ``(lengths, student log probs, teacher log probs, action mask)``
#: (float32, float32, bool).
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: Experiences as the queue actor sends them (:func:`pack_function`): ``("columns", fields, tensors)`` or
#: ``("trinity", bytes)`` (Trinity's ``Experience.serialize_many``).
Packed = tuple


class ReadNow(NamedTuple):
    """One read of the queue actor: the records sent whole (:func:`pack_function`) fill the positions that
    :attr:`stale` and :attr:`kept` leave free, in order."""

    data: Packed | None
    stale: list[StaleHeader]
    kept: list[KeptHeader]
    arrays: Arrays | None  # of the kept records
    available: int  # experiences the queue held before the read
    closed: bool  # closed and empty


def _identity_function(version_key: str) -> Callable[[Any], tuple[str, int, int, Any] | None]:
    """``identity(record)``: ``(rollout id, turn index, policy version, info["task"] or eid.tid)`` of a record with a
    rollout id (eid.batch or eid.task), an int turn index >= 0 and an int version >= 0 (``info[version_key]``, else
    ``info["model_version"]``); ``None`` for any other record (the strategy reads it whole and judges it)."""

    def identity(exp: Any) -> tuple[str, int, int, Any] | None:
        eid, info = exp.eid, exp.info
        if eid is None or type(info) is not dict or (eid.batch in ("", None) and eid.task in ("", None)):
            return None
        step, version = eid.step, info.get(version_key, info.get("model_version"))
        if type(step) is not int or step < 0 or type(version) is not int or version < 0:
            return None
        return eid.rid, step, version, info.get("task", eid.tid)

    return identity


def light_function(version_key: str, unscored_key: str
                   ) -> Callable[[list[Any]], tuple[list[int], list[LightHeader], Arrays | None]]:
    """``light(records)``: which records the sampler can read from their :data:`LightHeader` and :data:`Arrays`
    alone (their positions), with those. Such a record has a rollout id, an int turn index and version (``info[
    version_key]``, else ``info["model_version"]``), no ``info[unscored_key]``, and 1-d CPU tensors without autograd:
    int tokens, float log probs, a bool action mask, the three of the response's length (> 0). ``[], [], None``
    when their tensors cannot be concatenated on the CPU."""

    identity = _identity_function(version_key)

    def light(records: list[Any]) -> tuple[list[int], list[LightHeader], Arrays | None]:
        import numpy as np
        import torch

        floats, ints = (torch.float32, torch.bfloat16, torch.float16, torch.float64), (torch.int64, torch.int32)
        at, heads = [], []
        for i, exp in enumerate(records):
            head, prompt_length = identity(exp), exp.prompt_length
            if head is None or exp.info.get(unscored_key) or type(prompt_length) is not int or prompt_length < 0:
                continue
            tokens, student, teacher, mask = arrays = exp.tokens, exp.logprobs, exp.teacher_logprobs, exp.action_mask
            if any(type(a) is not torch.Tensor or a.dim() != 1 for a in arrays) or tokens.dtype not in ints \
                    or mask.dtype is not torch.bool or student.dtype not in floats or teacher.dtype not in floats:
                continue
            n = tokens.shape[0] - prompt_length
            if n <= 0 or student.shape[0] != n or teacher.shape[0] != n or mask.shape[0] != n:
                continue
            at.append(i)
            rid, step, version, task = head
            heads.append((rid, step, version, exp.truncate_status == "prompt_truncated", task))
        if not at:
            return at, heads, None
        picked = [records[i] for i in at]
        try:
            cats = [torch.cat([getattr(e, key) for e in picked]) for key in ("logprobs", "teacher_logprobs",
                                                                                 "action_mask")]
        except RuntimeError:  # tensors on different devices
            return [], [], None
        if any(c.device.type != "cpu" or c.requires_grad for c in cats):
            return [], [], None
        lengths = np.fromiter((e.tokens.shape[0] - e.prompt_length for e in picked), dtype=np.int64, count=len(at))
        return at, heads, (lengths, cats[0].to(torch.float32).numpy(), cats[1].to(torch.float32).numpy(),
                           cats[2].numpy())

    return light


def _take_function(version_key: str) -> Callable[..., Any]:
    """``take(storage, n, most, timeout, stale_below)``, a coroutine for the queue actor's event loop: the next
    records, in order, until ``n`` are not stale or ``most`` are taken (as Trinity's ``get_batch``: a payload's rest
    stays in ``exp_pool``); returns those with their positions in the read and the stale records' headers. On a
    timeout (or any error) every record taken goes back to the head of ``exp_pool``."""

    identity = _identity_function(version_key)

    async def take(storage: Any, n: int, most: int, timeout: float, stale_below: int | None
                   ) -> tuple[list[tuple[int, Any]], list[StaleHeader]]:
        import asyncio

        pool, popped, taken, stale = storage.exp_pool, [], [], []
        try:
            while len(taken) < n and len(popped) < most:
                if not pool:
                    pool.extend(await asyncio.wait_for(storage.queue.get(), timeout))
                    continue
                exp = pool.popleft()
                popped.append(exp)
                if stale_below is not None and (head := identity(exp)) is not None and head[2] < stale_below:
                    stale.append((len(popped) - 1, *head))
                else:
                    taken.append((len(popped) - 1, exp))
        except BaseException:
            pool.extendleft(reversed(popped))  # nothing taken is lost: the next read starts with it
            raise
        return taken, stale

    return take


def read_now_function(version_key: str, unscored_key: str) -> Callable[..., tuple]:
    """``read_now(storage, limit, timeout, stale_below=None, keep=False)`` for ``__ray_call__`` on Trinity's
    ``QueueStorage`` actor; returns the fields of :class:`ReadNow`. It counts the experiences the queue holds and,
    when that is not 0 and the actor's event loop is known, takes the next ``min(count, limit)`` of them in order (as
    Trinity's ``get_batch``: a payload's rest stays in ``exp_pool``); otherwise it takes none (read them with
    Trinity's reader). ``stale_below``: a record whose version is an int in ``[0, stale_below)`` is dropped in the
    actor, only its :data:`StaleHeader` comes back, not counted towards ``limit``. ``keep``: each record that
    :func:`light_function` can read stays in the actor under a key until :func:`fetch_function` takes it; only its
    :data:`KeptHeader` and arrays come back. ``timeout``: the take's; on a timeout the records taken go back.

    ``__ray_call__`` runs in a Ray thread: the count only reads, and the take runs on the actor's one running event
    loop in another thread (found once), so only that loop changes the queue."""
    light, pack, take = light_function(version_key, unscored_key), pack_function(), _take_function(version_key)

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

    def read_now(storage: Any, limit: int, timeout: float, stale_below: int | None = None, keep: bool = False
                 ) -> tuple:
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
            return None, [], [], None, available, closed
        future = asyncio.run_coroutine_threadsafe(take(storage, n, available, timeout, stale_below), loop)
        try:
            taken, stale = future.result(timeout=timeout + 30.0)
        except StopAsyncIteration:  # closed and empty (cannot happen with n counted, but Trinity may say so)
            return None, [], [], None, 0, True
        kept: list[KeptHeader] = []
        arrays = None
        if keep and taken:
            at, heads, arrays = light([exp for _, exp in taken])
            store = storage.__dict__.setdefault("_divopd_kept", {})
            key = storage.__dict__.get("_divopd_next_key", 0)
            for i, head in zip(at, heads, strict=True):
                position, exp = taken[i]
                store[key] = exp
                kept.append((position, key, *head))
                key += 1
            storage.__dict__["_divopd_next_key"] = key
            light_at = set(at)
            taken = [t for i, t in enumerate(taken) if i not in light_at]
        data = pack([exp for _, exp in taken]) if taken else None
        return data, stale, kept, arrays, available, closed

    return read_now


def pack_function() -> Callable[[list[Any]], Packed]:
    """``pack(experiences)``: Trinity ``Experience`` records for one transfer, each tensor field concatenated over the
    records (one tensor a field, the records' shapes beside it) and the other fields as they are; :func:`unpack` gives
    the records back, equal field by field. Records with custom fields or multi-modal inputs, or a field whose tensors
    differ in dtype, go as Trinity's ``Experience.serialize_many`` does it."""

    def pack(experiences: list[Any]) -> Packed:
        import torch

        cls = type(experiences[0])
        tensor_fields, other_fields = getattr(cls, "_TENSOR_FIELDS", None), getattr(cls, "_META_FIELDS", None)
        if tensor_fields is None or other_fields is None \
                or any(e.custom_fields or e.multi_modal_inputs is not None for e in experiences):
            return "trinity", cls.serialize_many(experiences)
        tensors = {}
        for name in tensor_fields:
            values = [getattr(e, name) for e in experiences]
            present = [v for v in values if v is not None]
            if not present:
                continue
            if any(type(v) is not torch.Tensor or v.dtype != present[0].dtype for v in present):
                return "trinity", cls.serialize_many(experiences)
            flat = torch.cat([v.detach().cpu().reshape(-1) for v in present])
            tensors[name] = ([None if v is None else tuple(v.shape) for v in values],
                             flat if flat.dtype == torch.bfloat16 else flat.numpy())  # numpy: Ray sends it faster
        return "columns", [{name: getattr(e, name) for name in other_fields} for e in experiences], tensors

    return pack


def unpack(packed: Packed) -> list[Experience]:
    """The experiences of one :func:`pack_function` transfer, in order."""
    if packed[0] == "trinity":
        return Experience.deserialize_many(packed[1])
    _, others, tensors = packed
    columns = {}
    for name, (shapes, flat) in tensors.items():
        if isinstance(flat, np.ndarray):  # Ray may give a read-only view of its object store: copied
            flat = torch.from_numpy(np.array(flat))
        parts = iter(flat.split([math.prod(shape) for shape in shapes if shape is not None]))
        columns[name] = [None if shape is None else next(parts).view(shape) for shape in shapes]
    return [Experience(**fields, **{name: column[i] for name, column in columns.items()}, custom_fields=[],
                       multi_modal_inputs=None) for i, fields in enumerate(others)]


def fetch_function() -> Callable[..., tuple[Packed | None, list[int]]]:
    """``fetch(storage, keys, release, pop=True)`` for ``__ray_call__`` on the queue actor: drop the kept records
    ``release``, then pack those of ``keys`` in order (``pop``: and stop keeping them). Returns ``(packed, the keys
    the actor does not hold)``; nothing is packed or popped when a key is missing."""
    pack = pack_function()

    def fetch(storage: Any, keys: list[int], release: list[int], pop: bool = True) -> tuple[Packed | None, list[int]]:
        store = storage.__dict__.setdefault("_divopd_kept", {})
        for key in release:
            store.pop(key, None)
        found = [store.get(key) for key in keys]
        missing = [key for key, exp in zip(keys, found, strict=True) if exp is None]
        if missing or not found:
            return None, missing
        if pop:
            for key in keys:
                del store[key]
        return pack(found), []

    return fetch
