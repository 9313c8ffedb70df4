"""The queue actor's read (:func:`read_now_function`) on a stand-in of Trinity's ``QueueStorage`` whose queue never
delivers: a take that times out loses nothing. (The real actor is read in test_sample_strategy.py.)"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import pytest

pytest.importorskip("trinity.algorithm.sample_strategy")

import torch  # noqa: E402
from trinity.common.experience import EID, Experience  # noqa: E402

from divopd.integrations.trinity_queue import read_now_function  # noqa: E402


class _SilentQueue:
    """Counts three experiences in one payload but never hands it over (as a writer that is slower than its count)."""

    _queue = [[None, None, None]]

    def qsize(self) -> int:
        return 1

    def stopped(self) -> bool:
        return False

    async def get(self) -> list:
        await asyncio.sleep(3600)
        return []


class _Storage:
    def __init__(self, records: list[Experience]) -> None:
        self.exp_pool, self.queue = deque(records), _SilentQueue()


def test_a_take_that_times_out_puts_back_what_it_took() -> None:
    records = [Experience(eid=EID(batch=0, task=r, run=0, step=0), tokens=torch.arange(4), prompt_length=2,
                          logprobs=torch.zeros(2), teacher_logprobs=torch.zeros(2), info={"model_version": 0})
               for r in range(2)]
    storage = _Storage(list(records))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        storage.__dict__["_divopd_event_loop"] = loop  # as found in the actor
        read_now = read_now_function("divopd_policy_version", "divopd_unscored")
        with pytest.raises(TimeoutError):
            read_now(storage, 5, 0.2, None, True)
        assert list(storage.exp_pool) == records and "_divopd_kept" not in storage.__dict__
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
