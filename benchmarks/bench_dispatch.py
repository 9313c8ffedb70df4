"""Dispatch inside verl: verl's own (B sessions a step) against the DivOPD buffer's matched dispatch (ρ* = 2).

Run in the verl venv (CPU, a local Ray for TransferQueue):

    PYTHONPATH=src .venv-verl/bin/python benchmarks/bench_dispatch.py [--steps 20] [--batch-size 32]

Real (:mod:`divopd.integrations.verl_try`, as ``examples/try_verl.py``): verl 0.9.1's TQ agent-loop worker under
divopd's override (``_run_prompt``, the agent-loop registry, its record writer), verl's ``LLMServerClient`` and
teacher path, divopd's ``divopd_env_agent`` playing the pure-Python ``tiny`` env (the packaged ``tiny`` setting's
horizon, 12 turns), TransferQueue, and :class:`~divopd.integrations.verl.DivOPDReplayBuffer` with its
:class:`~divopd.integrations.verl_dispatch.VerlDispatch` (``before_step`` → the manager's ``start_sessions``).
Stand-ins: the vLLM servers (in-process HF models: random tiny student and teacher,
``divopd.explore.envs.tiny.build_tiny_pair``), the manager's held prompts (plain lists), and verl's trainer loop
(this script: a synchronous step = start the step's sessions and play them to the end, then ``sample``; the
learner version = step − 1).

Per dispatch and rule (``divopd``, and ``vanilla``, the arrival-order reader): turns generated and teacher-scored per
trained turn, expired share of them, effective rollouts per batch, unused share of the rollouts received (none of their
turns trained), starved steps, the arrival ratio from step 5 on (mean, min–max), wall seconds per step. Prints a
Markdown table and each row's arrival ratio step by step (docs/performance.md, "Dispatch"). Trinity-RFT's side:
``bench_dispatch_trinity.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


class _Manager:
    """What the buffer's dispatch calls on divopd's agent-loop manager: play prompts through verl's worker."""

    def __init__(self, agent_worker: Any, rows: list[dict]) -> None:
        self.worker, self.rows, self.next = agent_worker, rows, 0

    def prompts(self, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            out.append({"uid": f"p{self.next}", "row": self.rows[self.next % len(self.rows)]})
            self.next += 1
        return out

    def start_sessions(self, prompts: list[dict]) -> None:
        from divopd.integrations.verl_try import play_prompts

        play_prompts(self.worker, prompts)


def run(dispatch: str, method: str, steps: int, batch_size: int, models: dict[str, str], rows: list[dict]
        ) -> dict[str, Any]:
    import transfer_queue as tq

    from divopd.integrations.verl import DivOPDReplayBuffer
    from divopd.integrations.verl_try import worker

    agent, student, _ = worker(models, max_new_tokens=int(rows[0]["explorer"]["generation"]["max_new_tokens"]))
    manager = _Manager(agent, rows)
    rb = DivOPDReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=3,
                            max_off_policy_strategy="drop", poll_interval=0.01, refill_fn=None,
                            sampler_kwargs={"method": method, "dispatch": dispatch, "target_arrival_ratio": 2.0,
                                            "horizon": int(rows[0]["max_steps"])})
    if dispatch == "matched":  # what divopd's manager does when it links: the buffer starts the sessions
        rb.dispatch.link(manager, sessions_per_prompt=1, gen_batch_size=1)
        # verl's refill_fn puts fresh prompts into the manager's held prompts (here plain lists, not TensorDicts)
        rb.dispatch.refill_fn = lambda n: rb.dispatch.reservoir.append(manager.prompts(n))
        rb.dispatch._take = lambda n, _step: _take(rb.dispatch.reservoir, n)
    effective, times, starved = [], [], 0
    selected_rollouts: set[str] = set()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        student.version = step - 1
        if dispatch == "verl":  # verl's prepare_step: train_batch_size prompts, each one session (rollout.n = 1)
            manager.start_sessions(manager.prompts(batch_size))
        else:
            rb._ensure_sampler(batch_size)
            rb.dispatch.before_step(step)
        batch, metrics = rb.sample_nowait(global_steps=step, partition_id="train", batch_size=batch_size)
        if batch is None:
            starved += 1
        else:
            effective.append(metrics["sampler/effective_rollouts"])
            selected_rollouts.update(k.rsplit("_", 1)[0] for k in batch.keys)
            tq.kv_clear(keys=batch.keys, partition_id="train")
        times.append(time.perf_counter() - t0)
    ledger = dataclasses.asdict(rb.sampler.ledger)
    rule = rb.dispatch.plugin.dispatch
    trained = ledger["selected"]
    clear = list((tq.kv_list(partition_id="train") or {}).get("train", {}))
    if clear:
        tq.kv_clear(keys=clear, partition_id="train")
    return {"turns_per_trained": ledger["received"] / max(trained, 1),
            "expired_share": ledger["expired"] / max(ledger["received"], 1),
            "effective_rollouts": float(np.mean(effective)) if effective else 0.0,
            "unused_share": 1 - len(selected_rollouts) / max(rule.rollouts_observed, 1),
            "starved_steps": float(starved), "s_per_step": statistics.median(times),
            "ratio_from_5": float(np.mean(rule.ratios[4:] or [0.0])),
            "ratio_min_from_5": float(min(rule.ratios[4:] or [0.0])),
            "ratio_max_from_5": float(max(rule.ratios[4:] or [0.0])),
            "ratios": rule.ratios}


def _take(reservoir: list[list[dict]], n: int) -> list[dict]:
    """The oldest ``n`` held prompts."""
    out: list[dict] = []
    while len(out) < n and reservoir:
        head = reservoir.pop(0)
        need = n - len(out)
        out += head[:need]
        if len(head) > need:
            reservoir.insert(0, head[need:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--methods", default="divopd,vanilla")
    args = parser.parse_args()

    import ray
    import transfer_queue as tq

    from divopd.commands.tasks import task_rows
    from divopd.explore.envs.tiny import build_tiny_pair
    from divopd.train.config import load_config

    torch.set_num_threads(1)
    cfg = load_config("tiny", ["explorer.env=tiny", "explorer.env_kwargs={}"])
    rows = task_rows(cfg, "train")
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    tq.init()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            models = build_tiny_pair(Path(tmp))
            results = {(d, m): run(d, m, args.steps, args.batch_size, models, rows)
                       for m in args.methods.split(",") for d in ("verl", "matched")}
    finally:
        tq.close()
        ray.shutdown()
    print(f"verl 0.9.1 TQ worker, tiny env (horizon {rows[0]['max_steps']}), B = {args.batch_size}, "
          f"{args.steps} synchronous steps, target_arrival_ratio 2.0\n")
    print("| dispatch | rule | turns generated / trained | expired share | effective rollouts / batch | "
          "unused share of rollouts | starved steps | arrival ratio, steps 5+ (min–max) | s / step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (d, m), r in results.items():
        name = "verl's (B sessions a step)" if d == "verl" else "matched (ρ* = 2)"
        print(f"| {name} | {m} | {r['turns_per_trained']:.2f} | {r['expired_share']:.0%} | "
              f"{r['effective_rollouts']:.1f} | {r['unused_share']:.0%} | {r['starved_steps']:.0f} | "
              f"{r['ratio_from_5']:.2f} ({r['ratio_min_from_5']:.2f}–{r['ratio_max_from_5']:.2f}) | "
              f"{r['s_per_step']:.2f} |")
    print("\nArrival ratio per step (turns arrived ÷ B), steps 1, 2, ...:\n")
    for (d, m), r in results.items():
        name = "verl's" if d == "verl" else "matched"
        print(f"- {name}, {m}: {' '.join(f'{x:.2f}' for x in r['ratios'])}")


if __name__ == "__main__":
    main()
