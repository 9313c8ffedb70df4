"""The DivOPD buffer's experience log (``sampler_kwargs.experience_dir``) and its matched dispatch.

The log a verl run writes is divopd's: replaying it with the same rule and settings gives, update by update, the
statistics the buffer reported. The dispatch: divopd's agent-loop manager holds the training prompts verl submits
(its per-step batch, the async warm-up, ``refill_fn``) and the buffer starts, each step, the sessions the matched rule
asks for; validation prompts pass straight through; ``rollout.n`` sessions per prompt divide the prompts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import numpy as np  # noqa: E402
import transfer_queue as tq  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl_helpers import (  # noqa: E402
    clear_partition,
    make_buffer,
    new_partition,
    put_turns,
    replay_config,
    stream_log,
    ticks,
)

from divopd.analysis.replay import replay  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.integrations import verl_agent_loop, verl_dispatch  # noqa: E402
from divopd.integrations.verl_agent_loop import DivOPDAgentLoopManagerTQ  # noqa: E402
from divopd.sampling.ledger import Ledger  # noqa: E402

B = 6
DISPATCH_KEYS = ("sampler/arrival_ratio", "sampler/sessions_started", "sampler/turns_per_session",
                 "sampler/expired_share")


@pytest.mark.parametrize("method", ["divopd", "vanilla"])
def test_replaying_the_buffers_log_gives_the_statistics_it_reported(transfer_queue, tmp_path: Path,
                                                                     method: str) -> None:
    log = stream_log(tmp_path)
    out = tmp_path / "experience"
    partition = new_partition()
    rb = make_buffer(method, experience_dir=str(out))
    steps = []
    try:
        for j, turns in enumerate(ticks(log)):
            put_turns(partition, turns, prompt_uid=f"p{j}")
            batch, metrics = rb.sample_nowait(global_steps=j + 1, partition_id=partition, batch_size=B)
            if batch is not None:
                tq.kv_clear(keys=batch.keys, partition_id=partition)
                assert all(key in metrics for key in DISPATCH_KEYS)
            steps.append((batch is not None, metrics))
    finally:
        clear_partition(partition)
    rb.dispatch.plugin.compact()
    series = replay(out, replay_config(method))["methods"][method]["series"]
    for j, (composed, metrics) in enumerate(steps):
        for name in ("selected", "expired", "invalid"):
            assert metrics[f"ledger/{name}"] == series[name][j], (j, name)
        if composed:
            assert metrics["sampler/effective_rollouts"] == pytest.approx(series["effective_rollouts"][j]), j
    assert len(list(read_log(out))) == rb.sampler.ledger.received
    done = subprocess.run([sys.executable, "-m", "divopd", "tune-cap", str(out), "--batch-size", str(B)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    arrived = sum(m["sampler/arrival_ratio"] for c, m in steps if c) * B
    assert arrived <= rb.sampler.ledger.received


def _prompts(n: int, start: int, validate: bool = False, horizon: int = 12):
    """A prompt batch as verl's trainer submits it (``_fetch_one_gen_batch`` → ``_next_train_batch``)."""
    task = f'{{"env": "tiny", "task": "t", "max_steps": {horizon}}}'
    batch = tu.get_tensordict({"uid": np.array([f"u{start + i}" for i in range(n)], dtype=object),
                               "index": np.arange(start, start + n),
                               "extra_info": np.array([{"divopd_task": task}] * n, dtype=object)})
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    if validate:
        tu.assign_non_tensor_data(batch, "validate", True)
    return batch


class _Trainer:
    """verl's trainer side of the dispatch: its per-step submission and ``refill_fn`` (``_add_prompts_to_generate``:
    whole ``gen_batch_size`` chunks), each registering prompt markers in TransferQueue and calling the manager."""

    def __init__(self, manager: DivOPDAgentLoopManagerTQ, gen_batch_size: int) -> None:
        self.manager, self.gen_batch_size, self.next = manager, gen_batch_size, 0
        self.refills: list[int] = []

    def submit(self, n: int) -> int:
        batch = _prompts(n, self.next)
        self.next += n
        tq.kv_batch_put(keys=list(batch["uid"]), partition_id="train",
                        tags=[{"is_prompt": True, "status": "pending"}] * n)
        self.manager.generate_sequences(batch)
        return n

    def refill(self, n: int) -> int:
        assert n % self.gen_batch_size == 0, n
        self.refills.append(n)
        return self.submit(n)


@pytest.mark.parametrize(("n", "mode"), [(1, "sync"), (3, "async")])
def test_the_manager_holds_verls_prompts_and_the_buffer_starts_the_matched_sessions(
        transfer_queue, monkeypatch: pytest.MonkeyPatch, n: int, mode: str) -> None:
    started: list = []  # the batches verl's own dispatch (the workers) received
    monkeypatch.setattr(verl_agent_loop.AgentLoopManagerTQ, "generate_sequences",
                        lambda self, prompts: started.append(prompts))
    rb = make_buffer("divopd", target_arrival_ratio=2.0)
    rb.trainer_mode = mode
    manager = DivOPDAgentLoopManagerTQ.__new__(DivOPDAgentLoopManagerTQ)  # the dispatch side only: no workers
    manager.dispatch, manager._looked = None, False
    manager.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(n=n)),
                                     data={"gen_batch_size": 4, "train_batch_size": B})
    trainer = _Trainer(manager, gen_batch_size=4)
    rb.dispatch = verl_dispatch.VerlDispatch(rb.dispatch.plugin, trainer.refill, mode)
    rb.dispatch.plugin.dispatch.asynchronous = mode != "sync"
    rb._ensure_sampler(B)
    try:
        trainer.submit(B)  # prepare_step of step 1: held, not played
        assert started == [] and manager.dispatch is rb.dispatch and rb.dispatch.held == B
        assert rb.dispatch.plugin.dispatch.horizon == 12  # read from the task rows
        rb.dispatch.before_step(1)
        rule = rb.dispatch.plugin.dispatch
        first = len(started[0])
        assert first == -(-int(2.0 * B / 6) // n)  # 2 B turns at 6 turns per session (half the horizon 12)
        assert rule.started_total == first * n and rule.in_flight == first * n
        assert started[0]["global_steps"] == 1
        rb.dispatch.before_step(1)  # once per step
        assert len(started) == 1
        manager.generate_sequences(_prompts(2, 100, validate=True))  # validation: straight to the workers
        assert len(started) == 2 and len(started[1]) == 2
        # the sessions came back with 3 turns each: the rule asks for more sessions the next step
        rb.dispatch.observe([f"r{i}" for i in range(first * n) for _ in range(3)], [])
        metrics = rb.dispatch.step(Ledger())
        assert metrics["sampler/sessions_started"] == first * n and metrics["sampler/turns_per_session"] == 3
        assert metrics["sampler/arrival_ratio"] == first * n * 3 / B
        expected = rule.prompts_to_submit()
        assert expected * n >= 2 * B / 3 - n  # m = 3 now: about 2 B / 3 sessions, in whole prompts
        trainer.submit(B)
        rb.dispatch.before_step(2)
        assert len(started[2]) == expected
        for step in range(3, 12):  # verl keeps submitting B prompts a step: the reservoir stays bounded
            trainer.submit(B)
            rb.dispatch.before_step(step)
            assert rb.dispatch.held <= verl_dispatch.RESERVOIR_STEPS * max(rule.prompts_to_submit(), 4) + B
        assert rb.dispatch.released > 0  # surplus prompts released, their markers cleared
        listing = (tq.kv_list(partition_id="train") or {}).get("train", {})
        held = {str(u) for p in rb.dispatch.reservoir for u in p["uid"]}
        played = {str(u) for p in started for u in p["uid"]}
        markers = {k for k, tag in listing.items() if tag.get("is_prompt")}
        assert markers <= held | played  # a released prompt leaves no marker behind
    finally:
        tq.kv_clear(keys=list((tq.kv_list(partition_id="train") or {}).get("train", {})), partition_id="train")
