"""Fixtures of the verl plug-in tests (``make test-verl``); nothing here imports verl at collection time, so the
default suite, where verl is not installed, skips these files cleanly (each starts with ``pytest.importorskip``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def transfer_queue() -> Iterator[object]:
    """A real TransferQueue (controller + 2 SimpleStorage units) on a local Ray, as verl's CPU tests run it.

    TransferQueue's actors ask for 1 CPU each (3 in all): Ray is started with 4 logical CPUs so that they fit on a
    2-core machine (they mostly wait on sockets).
    """
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    try:
        tq.init()
        yield tq
        tq.close()
    finally:
        ray.shutdown()
