"""Trinity-RFT's default sample strategy against divopd's, side by side on one turn stream through Trinity's real queue
(a local Ray, Trinity's writer and reader). Loaded by ``bench_integrations.py --framework trinity``; run it with the
Trinity venv's python.

The stream: rollouts of 8 turns (prompt 96 tokens, response 16), ``arrival`` x B turns arriving per step (whole
rollouts), versions lagging 0-2 behind the learner. ``arrival`` 1.0 (the default) is an explorer matched to the trainer:
in steady state both strategies take B experiences out of the queue per step (divopd more only for the turns that
expire in its pool); above 1.0 divopd reads the surplus into its pool (that is what the pool is for) while the
default leaves it queued. ``preloaded``: every step's arrivals written before the first
``sample()``; ``ticks``: each step's arrivals written just before that step's ``sample()``. Each sampler reads its
own queue holding the same stream, and the two run interleaved, step by step (:func:`_row`), so that both see the
same load on a shared machine. ``damaged`` (:func:`_stream`): 2.5 × the arrivals, every other rollout from policies
3-4 versions old (stale at once), and each turn invalid with probability 0.09 (one of four defects).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import ray
import torch
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY
from trinity.buffer import get_buffer_writer
from trinity.common.config import BufferConfig, ExperienceBufferConfig
from trinity.common.experience import EID, Experience

import divopd.integrations.trinity  # noqa: F401  (registers "divopd")
from bench_integrations import Row

TURNS = 8
PROMPT, RESPONSE = 96, 16


DEFECTS = ("missing_teacher", "length_mismatch", "prompt_truncated", "no_valid_token")


def _stream(batch_size: int, steps: int, seed: int, arrival: float, damaged: bool = False) -> list[list[Experience]]:
    """Per step, the experiences that arrive before it (``arrival`` x B turns, whole rollouts, in arrival order)."""
    rng = np.random.default_rng(seed)
    per_step = -(-round(batch_size * arrival * (2.5 if damaged else 1)) // TURNS)
    out, rollout = [], 0
    for step in range(steps + 4):
        arrivals = []
        for _ in range(per_step):
            lag = 3 + int(rng.integers(0, 2)) if damaged and rollout % 2 else int(rng.integers(0, 3))
            version = max(0, step - lag)
            for t in range(TURNS):
                student = -rng.exponential(1.0, RESPONSE).astype(np.float32)
                teacher = torch.from_numpy(student - rng.exponential(0.5, RESPONSE).astype(np.float32))
                exp = Experience(
                    eid=EID(batch=0, task=rollout, run=0, step=t),
                    tokens=torch.from_numpy(rng.integers(0, 30000, PROMPT + RESPONSE)), prompt_length=PROMPT,
                    logprobs=torch.from_numpy(student), reward=0.0, teacher_logprobs=teacher,
                    action_mask=torch.ones(RESPONSE, dtype=torch.bool), info={"model_version": version})
                defect = DEFECTS[int(rng.integers(0, 4))] if damaged and rng.random() < 0.09 else None
                if defect == "missing_teacher":
                    exp.teacher_logprobs = None
                elif defect == "length_mismatch":
                    exp.teacher_logprobs = teacher[:-1]
                elif defect == "prompt_truncated":
                    exp.truncate_status = "prompt_truncated"
                elif defect == "no_valid_token":
                    exp.action_mask = torch.zeros(RESPONSE, dtype=torch.bool)
                arrivals.append(exp)
            rollout += 1
        out.append(arrivals)
    return out


def _buffer(folder: Path, batch_size: int) -> BufferConfig:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    config = BufferConfig(train_batch_size=batch_size)
    config.trainer_input.experience_buffer = ExperienceBufferConfig(
        name=name, storage_type="queue", path=str(folder / f"{name}.jsonl"), max_read_timeout=60.0)
    config.trainer_input.experience_buffer.batch_size = batch_size  # what Trinity's config checker sets
    return config


KINDS = ("default", "divopd")


async def _row(stream: list[list[Experience]], batch_size: int, feed: str, steps: int,
               folder: Path) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Both strategies side by side, interleaved step by step so that both see the same machine load: each reads its
    own queue holding the same stream; at every step both queues get that step's arrivals (``ticks``), then both
    strategies sample, the default first at even steps and divopd first at odd ones. Returns the ``sample()`` wall
    times (ms) of each and the experiences each took out of its queue per step (mean)."""
    writers, strategies = {}, {}
    for kind in KINDS:
        buffer = _buffer(folder, batch_size)
        writers[kind] = get_buffer_writer(buffer.trainer_input.experience_buffer)
        await writers[kind].acquire()
        args = {} if kind == "default" else {"method": "divopd", "pool_factor": 4, "cap": 4, "max_staleness": 2}
        strategies[kind] = SAMPLE_STRATEGY.get(kind)(buffer_config=buffer, **args)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        if feed == "preloaded":
            for arrivals in stream:
                for kind in KINDS:
                    await writers[kind].write(arrivals)
        for step in range(steps):
            if feed == "ticks":
                for kind in KINDS:
                    await writers[kind].write(stream[step])
            for kind in (KINDS if step % 2 == 0 else KINDS[::-1]):
                t0 = time.perf_counter()
                batch, _, _ = await strategies[kind].sample(step + 1)
                times[kind].append((time.perf_counter() - t0) * 1000)
                assert len(batch) == batch_size
    finally:
        for writer in writers.values():
            await writer.release()
            ray.kill(writer.queue)
    read = {"default": float(batch_size), "divopd": strategies["divopd"].sampler.ledger.received / steps}
    return times, read


def measure(batch_sizes: list[int], feeds: list[str], steps: int, seed: int, arrival: float = 1.0,
            damaged: bool = False) -> list[Row]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 * 2**20, log_to_driver=False)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for b in batch_sizes:
                stream = _stream(b, steps, seed, arrival, damaged)
                for feed in feeds:
                    ms, read = asyncio.run(_row(stream, b, feed, steps, Path(tmp)))
                    res = {kind: (statistics.median(ms[kind]), float(np.percentile(ms[kind], 90))) for kind in KINDS}
                    rows.append(Row("trinity", "damaged" if damaged else "clean", b, feed, steps, *res["default"],
                                    *res["divopd"], default_read=read["default"], divopd_read=read["divopd"]))
    finally:
        ray.shutdown()
    return rows
