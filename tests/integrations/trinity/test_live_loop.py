"""End to end on a CPU: Trinity's trainer-side read step (``Trainer._sample_data``) consumes, through the divopd
strategy, from a live explorer-side writer (a Ray actor writing with Trinity's buffer writer while the trainer reads),
with a checkpoint written and read back by Trinity's ``StateManager`` mid-run.

What is not run here, and why: Trinity's ``Trainer.train`` needs a train engine (verl's FSDP workers, which need
CUDA, or the remote Tinker service) and its ``Explorer`` needs rollout models served by vLLM on a GPU; neither has a
CPU path in trinity-rft 0.6.0. The loop below is the part of ``Trainer.train`` between them: sample, then publish
the new model version to the explorer (the weight sync), then checkpoint.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trinity.algorithm.sample_strategy")

import opd_stream  # noqa: E402
import ray  # noqa: E402
from opd_stream import SETTINGS, rollout_ranks, to_experience  # noqa: E402
from queue_helpers import assert_ledger_identity, buffer_config, strategy  # noqa: E402
from trinity.buffer import get_buffer_writer  # noqa: E402
from trinity.common.config import BufferConfig  # noqa: E402
from trinity.manager.state_manager import StateManager  # noqa: E402
from trinity.trainer.trainer import Trainer  # noqa: E402

from divopd.experience.log import read_log  # noqa: E402

# Ray's workers cannot import the test folder's modules: send their code along with the actor
ray.cloudpickle.register_pickle_by_value(opd_stream)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROLLOUTS_PER_STEP = 3  # rollouts the explorer finishes per explorer step
AHEAD = 1  # the explorer runs at most this many steps ahead of the trainer's published version


@ray.remote(num_cpus=0)
class Explorer:
    """The explorer side: Trinity's writer on the experience queue, fed with the rollouts of a real divopd run; each
    explorer step's experiences carry the model version the trainer last published (the weight sync)."""

    def __init__(self, buffer: BufferConfig, log: str, deadline_s: float) -> None:
        ranks = rollout_ranks(Path(log))
        rollouts: dict[str, list] = {}
        for logged in read_log(log):
            rollouts.setdefault(logged.turn.rollout_id, []).append(logged.turn)
        self.rollouts = [(ranks[rid], turns) for rid, turns in rollouts.items()]
        self.writer = get_buffer_writer(buffer.trainer_input.experience_buffer)
        self.version = 0
        self.written: list[str] = []
        self.deadline_s = deadline_s

    async def publish(self, version: int) -> None:
        self.version = version

    async def run(self) -> list[str]:
        await self.writer.acquire()
        try:
            for start in range(0, len(self.rollouts), ROLLOUTS_PER_STEP):
                step = start // ROLLOUTS_PER_STEP
                waited = time.monotonic()
                while self.version < step - AHEAD:  # Trinity's explorer waits for the weight sync the same way
                    assert time.monotonic() - waited < self.deadline_s, "the trainer side stopped reading"
                    await asyncio.sleep(0.05)
                for rank, turns in self.rollouts[start:start + ROLLOUTS_PER_STEP]:
                    experiences = [to_experience(t, rank) for t in turns]
                    for exp in experiences:
                        exp.info["model_version"] = self.version
                    await self.writer.write(experiences)
                    self.written += [str(e.eid) for e in experiences]
        finally:
            await self.writer.release()  # the queue closes: the trainer side drains it and stops
        return self.written


def test_trainer_read_loop_consumes_a_live_writer(ray_local, divopd_log: Path, tmp_path: Path) -> None:
    asyncio.run(_live_loop(divopd_log, tmp_path))


async def _live_loop(log: Path, tmp_path: Path) -> None:
    batch_size = SETTINGS["batch_size"]
    buffer = buffer_config(tmp_path, batch_size, max_read_timeout=60.0)
    trainer = SimpleNamespace(sample_strategy=strategy(buffer, method="divopd", **SETTINGS), train_step_num=0)
    explorer = Explorer.remote(buffer, str(log), 120.0)
    producing = explorer.run.remote()
    await explorer.publish.remote(0)  # the actor is up (a failure to build it surfaces here, not as a read timeout)
    state = StateManager(path=str(tmp_path / "checkpoint"), trainer_name="trainer")
    seen: set[str] = set()
    retired = []  # the first strategy's reader created the queue actor: Ray ends it once that handle is gone
    try:
        while True:
            try:  # Trinity's own trainer-side read: sample(train_step_num + 1) plus its task count
                exps, metrics, samples = await Trainer._sample_data(trainer)
            except StopAsyncIteration:
                break
            trainer.train_step_num += 1
            await explorer.publish.remote(trainer.train_step_num)
            plugin = trainer.sample_strategy
            uids = [str(e.eid) for e in exps]
            assert len(exps) == batch_size and not seen.intersection(uids) and len(set(uids)) == batch_size
            seen.update(uids)
            learner_version = trainer.train_step_num - 1
            assert min(e.info["model_version"] for e in exps) >= learner_version - SETTINGS["max_staleness"]
            assert_ledger_identity(plugin.sampler.ledger)
            assert plugin.held == plugin.sampler.waiting <= plugin.config.pool_size
            assert metrics["sample/task_count"] >= 1 and metrics["ledger/selected"] == len(seen) and samples
            if trainer.train_step_num == 3:  # Trinity's checkpoint of the trainer state, read back by a new strategy
                state.save_trainer(current_step=3, sample_strategy_state=plugin.state_dict())
                retired.append(plugin)
                trainer.sample_strategy = strategy(buffer, method="divopd", **SETTINGS)
                trainer.sample_strategy.load_state_dict(state.load_trainer()["sample_strategy_state"])
                assert trainer.sample_strategy.sampler.ledger == plugin.sampler.ledger
        written = await producing
    finally:
        ray.kill(explorer)
        ray.kill(trainer.sample_strategy._reader.queue)
    ledger = trainer.sample_strategy.sampler.ledger
    assert trainer.train_step_num >= 6, f"only {trainer.train_step_num} steps"
    assert ledger.received == len(written) > 0  # every written experience was read and is in one ledger bucket
    assert_ledger_identity(ledger)
    assert ledger.selected == len(seen) == batch_size * trainer.train_step_num
    assert seen <= set(written)
