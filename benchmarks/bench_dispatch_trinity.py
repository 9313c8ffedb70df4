"""Dispatch inside Trinity-RFT: the arrival ratio at a given ``buffer.batch_size`` (tasks per explore step).

Trinity's strategy cannot start sessions (its explorer starts ``buffer.batch_size`` tasks per explore step, each run
``algorithm.repeat_times`` times), so the matched rule there is a value to set: ``divopd tasks ... --for trinity``
prints one from half the horizon, and the strategy's warning names one from the turns per task it measured. Rows:

- Trinity's own sizing: ``buffer.train_batch_size`` defaults to ``buffer.batch_size × repeat_times`` (one experience
  per task), so B tasks a step;
- the value ``divopd tasks`` prints for the setting;
- the value the strategy's warning named in the previous row's run (when it warned).

Run in the Trinity venv (CPU, a local Ray for Trinity's queue and the engines):

    PYTHONPATH=src .venv-trinity/bin/python benchmarks/bench_dispatch_trinity.py [--steps 20] [--batch-size 32] \
      [--rows suggestion,own]

Real: Trinity-RFT 0.6.0's ``WorkflowRunner`` (``run_task``) playing divopd's ``divopd_opd_workflow`` on the
pure-Python ``tiny`` env (horizon 12, task rows from ``divopd tasks``), Trinity's ``ModelWrapper`` in front of the
student and the teacher, Trinity's queue (writer and reader) and
:class:`~divopd.integrations.trinity.DivOPDSampleStrategy` (``divopd``, and ``vanilla``, the arrival-order reader).
Stand-ins, as tests/integrations/trinity runs them: the vLLM engines (an HF model behind Trinity's engine interface,
``divopd.integrations.trinity_try``: random tiny student and teacher) and Trinity's explorer/trainer loop
(this script: explore step ``s`` at model version ``s − 1`` runs the step's tasks one after another, writes their
experiences to one queue per rule, then each rule's strategy samples step ``s``). Both rules read the same experiences.

Per row and rule: turns generated and teacher-scored per trained turn, expired share of the turns the strategy read,
turns left unread in Trinity's queue, effective rollouts per batch, unused share of the rollouts read, the arrival
ratio from step 5 on (mean, min–max; the strategy's ``sampler/arrival_ratio``, unread turns counted), wall seconds per
step (the step's rollouts + that rule's sample). Prints a Markdown table and each row's ratio step by step.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

#: A step short of valid turns waits this long for more (none come: the step's tasks ran), then counts as starved.
READ_TIMEOUT_S = 5.0


class _Warnings(logging.Handler):
    """The strategy's warning lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _buffer(folder: Path, batch_size: int) -> Any:
    from trinity.common.config import BufferConfig, ExperienceBufferConfig

    name = f"divopd-{uuid.uuid4().hex[:8]}"
    config = BufferConfig(train_batch_size=batch_size)
    config.trainer_input.experience_buffer = ExperienceBufferConfig(
        name=name, storage_type="queue", path=str(folder / f"{name}.jsonl"), max_read_timeout=READ_TIMEOUT_S)
    return config


async def run(tasks_per_step: int, methods: list[str], steps: int, batch_size: int, horizon: int, rows: list[Any],
              runner: Any, engines: list, folder: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """One row: ``tasks_per_step`` tasks an explore step, each rule's strategy on its own queue of the same turns."""
    import ray
    from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY
    from trinity.buffer import get_buffer_writer
    from trinity.common.experience import Experience
    from trinity.common.workflows import WORKFLOWS, Task

    import divopd.integrations.trinity  # noqa: F401  (registers "divopd")

    warnings = _Warnings()
    logging.getLogger("divopd.integrations").addHandler(warnings)
    buffers = {m: _buffer(folder, batch_size) for m in methods}
    writers = {m: get_buffer_writer(b.trainer_input.experience_buffer) for m, b in buffers.items()}
    for w in writers.values():
        await w.acquire()
    strategies = {m: SAMPLE_STRATEGY.get("divopd")(buffer_config=b, method=m, horizon=horizon,
                                                    target_arrival_ratio=2.0) for m, b in buffers.items()}
    for s in strategies.values():
        s.load_state_dict({})  # a fresh run, as Trinity's trainer says it
    out = {m: {"metrics": [], "times": [], "selected_rollouts": set(), "effective": [], "starved": 0}
           for m in methods}
    generated, next_task = 0, 0
    workflow = WORKFLOWS.get("divopd_opd_workflow")
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            for engine in engines:
                await engine.sync_model_weights.remote(step - 1)
            experiences = []
            for i in range(tasks_per_step):
                task = Task(workflow=workflow, raw_task=rows[next_task % len(rows)])
                task.batch_id, task.task_id = f"s{step}", i
                next_task += 1
                status, payload = await runner.run_task(task, batch_id=f"s{step}", repeat_times=1)
                if not status.ok:
                    raise RuntimeError(status.message)
                experiences += Experience.deserialize_many(payload)
            generated += len(experiences)
            for w in writers.values():
                await w.write(experiences)
            explored = time.perf_counter() - t0
            for m, strategy in strategies.items():
                t1 = time.perf_counter()
                try:
                    batch, metrics, _ = await strategy.sample(step)
                except TimeoutError:  # too few valid, fresh turns for a batch
                    out[m]["starved"] += 1
                    continue
                out[m]["times"].append(explored + time.perf_counter() - t1)
                out[m]["metrics"].append(metrics)
                out[m]["effective"].append(metrics["sampler/effective_rollouts"])
                out[m]["selected_rollouts"].update(str(e.eid.rid) for e in batch)
    finally:
        logging.getLogger("divopd.integrations").removeHandler(warnings)
        for w in writers.values():
            await w.release()
            ray.kill(w.queue)
    results = {}
    for m, o in out.items():
        strategy, last = strategies[m], o["metrics"][-1]
        ledger = strategy.sampler.ledger
        ratios = [x["sampler/arrival_ratio"] for x in o["metrics"]]
        results[m] = {
            "turns_per_trained": generated / max(ledger.selected, 1),
            "expired_share": ledger.expired / max(ledger.received, 1),
            "unread": generated - ledger.received,
            "effective_rollouts": float(np.mean(o["effective"])),
            "unused_share": 1 - len(o["selected_rollouts"]) / max(strategy.plugin.dispatch.rollouts_observed, 1),
            "turns_per_task": last["sampler/turns_per_session"], "starved": o["starved"],
            "s_per_step": statistics.median(o["times"]),
            "ratios": ratios, "from_5": ratios[4:] or [0.0]}
    return results, warnings.lines


async def _rows(args: Any, suggested: int, horizon: int, methods: list[str], rows: list[Any], config: Any,
                engines: list, folder: Path, results: dict) -> list[str]:
    """Every row in one event loop (Trinity's runner and model wrappers live in it); returns the warnings."""
    from trinity.explorer.workflow_runner import WorkflowRunner

    runner = WorkflowRunner(config, rollout_model_id=0, auxiliary_model_ids=[0], runner_id=0)
    # the cheap rows first; the warning's value (when it differs) next; Trinity's own sizing last
    chosen = args.rows.split(",")
    plan = [("`divopd tasks`' suggestion", suggested)] if "suggestion" in chosen else []
    if "own" in chosen:
        plan.append(("Trinity's own (B tasks a step)", args.batch_size))
    named: list[str] = []
    while plan:
        name, n = plan.pop(0)
        results[(name, n)], lines = await run(n, methods, args.steps, args.batch_size, horizon, rows, runner,
                                              engines, folder)
        _print_rows(name, n, results[(name, n)])
        named += [f"{name}, {n} tasks: {line}" for line in dict.fromkeys(lines)]
        print("\n".join(named[-len(dict.fromkeys(lines)):] if lines else []), file=sys.stderr, flush=True)
        band = [line for line in lines if "outside" in line]
        if name != "the strategy's warning" and band:
            value = int(re.search(r"buffer.batch_size: (\d+)", band[0]).group(1))
            if value not in {k for _, k in results} | {k for _, k in plan}:
                plan.insert(0, ("the strategy's warning", value))
    return named


def _print_rows(name: str, n: int, by_method: dict[str, dict[str, Any]]) -> None:
    """One row's table lines, printed as soon as it is measured."""
    for m, r in by_method.items():
        print(f"| {n} ({name}) | {m} | {r['turns_per_trained']:.2f} | {r['expired_share']:.0%} | {r['unread']} | "
              f"{r['effective_rollouts']:.1f} | {r['unused_share']:.0%} | {np.mean(r['from_5']):.2f} "
              f"({min(r['from_5']):.2f}–{max(r['from_5']):.2f}) | {r['starved']} | {r['s_per_step']:.2f} |",
              flush=True)
        print(f"{n} tasks, {m}, arrival ratio per step: {' '.join(f'{x:.2f}' for x in r['ratios'])}",
              file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--methods", default="divopd,vanilla")
    parser.add_argument("--rows", default="suggestion,own",
                        help="suggestion: divopd tasks' value (then the warning's, when it warns); own: B tasks a step")
    args = parser.parse_args()

    # first: without vLLM (a CPU) it registers import-only placeholders for the vLLM modules Trinity imports
    from divopd.integrations.trinity_try import engines, trinity_config

    # isort: split
    import ray
    import torch
    from datasets import load_dataset

    import divopd.integrations.trinity_workflow  # noqa: F401  (registers the divopd_* workflows)
    from divopd.commands.tasks import task_rows, trinity_batch_size_line
    from divopd.explore.envs.tiny import build_tiny_pair
    from divopd.integrations.trinity_tasks import write_tasks
    from divopd.train.config import load_config

    torch.set_num_threads(1)
    cfg = load_config("tiny", ["explorer.env=tiny", "explorer.env_kwargs={}", f"sampler.batch_size={args.batch_size}"])
    horizon = int(cfg.explorer.max_steps)
    suggestion = trinity_batch_size_line(cfg)
    suggested = int(re.search(r"buffer.batch_size: (\d+)", suggestion).group(1))
    methods = args.methods.split(",")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    results: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    named: list[str] = []
    print(f"Trinity-RFT 0.6.0 WorkflowRunner + queue, tiny env (horizon {horizon}), B = {args.batch_size}, "
          f"repeat_times 1, {args.steps} synchronous steps, target_arrival_ratio 2.0\n")
    print(f"`divopd tasks ... --for trinity` prints: {suggestion}\n")
    print("| buffer.batch_size | rule | turns generated / trained | expired share (of read) | left unread | "
          "effective rollouts / batch | unused share of rollouts read | arrival ratio, steps 5+ (min–max) | "
          "starved steps | s / step |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            models = build_tiny_pair(folder / "models")
            (folder / "tasks").mkdir()
            write_tasks(task_rows(cfg, "train"), folder / "tasks" / "train.jsonl")
            rows = list(load_dataset(str(folder / "tasks"), split="train"))  # what Trinity's TaskFileReader reads
            config = trinity_config(models)
            actors = engines(config, models, os.pathsep.join([*sys.path[1:], os.environ.get("PYTHONPATH", "")]))
            try:
                named += asyncio.run(_rows(args, suggested, horizon, methods, rows, config, actors, folder, results))
            finally:
                for actor in actors:
                    ray.kill(actor)
    finally:
        ray.shutdown()
    print("\nArrival ratio per step (sampler/arrival_ratio), steps 1, 2, ...:\n")
    for (_, n), by_method in results.items():
        for m, r in by_method.items():
            print(f"- {n} tasks, {m}: {' '.join(f'{x:.2f}' for x in r['ratios'])}")
    print("\nThe strategy's warnings:\n")
    for line in named:
        print(f"- {line}")


if __name__ == "__main__":
    main()
