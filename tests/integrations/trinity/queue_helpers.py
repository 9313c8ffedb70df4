"""Trinity-RFT's real experience queue for a test: its buffer config, its writer, and the divopd strategy on it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import ray
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY, SampleStrategy
from trinity.buffer import BufferWriter, get_buffer_writer
from trinity.common.config import BufferConfig, ExperienceBufferConfig

import divopd.integrations.trinity  # noqa: F401  (importing it registers "divopd"; test_plugin covers --plugin-dir)
from divopd.sampling import Ledger


def buffer_config(folder: Path, batch_size: int, max_read_timeout: float = 60.0) -> BufferConfig:
    """A trainer buffer config whose experience buffer is a fresh Trinity queue (it also persists to a JSON file)."""
    name = f"divopd-{uuid.uuid4().hex[:8]}"
    config = BufferConfig(train_batch_size=batch_size)
    config.trainer_input.experience_buffer = ExperienceBufferConfig(
        name=name, storage_type="queue", path=str(folder / f"{name}.jsonl"), max_read_timeout=max_read_timeout)
    return config


def strategy(config: BufferConfig, **args: Any) -> SampleStrategy:
    """The ``divopd`` strategy built the way Trinity's Trainer builds its sample strategy: through the registry."""
    return SAMPLE_STRATEGY.get("divopd")(buffer_config=config, **args)


@asynccontextmanager
async def queue_writer(config: BufferConfig) -> AsyncIterator[BufferWriter]:
    """Trinity's writer on the queue (acquired); afterwards released and the queue actor ended (it holds a
    process that imports torch)."""
    writer = get_buffer_writer(config.trainer_input.experience_buffer)
    await writer.acquire()
    try:
        yield writer
    finally:
        await writer.release()
        ray.kill(writer.queue)


def assert_ledger_identity(ledger: Ledger) -> None:
    parts = ledger.selected + ledger.expired + ledger.invalid + ledger.pending + ledger.queued
    assert ledger.received == parts, ledger
