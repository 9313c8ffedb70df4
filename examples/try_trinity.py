"""Try divopd's Trinity-RFT workflow on a CPU and see the experiences it hands Trinity's trainer.

Run from the repository root, in the Trinity venv (make setup-trinity):

    PYTHONPATH=src .venv-trinity/bin/python examples/try_trinity.py --tasks 2

Trinity-RFT 0.6.0's real ``WorkflowRunner`` plays divopd's ``divopd_opd_workflow`` on the ``tiny`` env (the packaged
``tiny`` setting: random tiny student and teacher, built in a temporary folder) for ``--tasks`` tasks, one run each,
with the task rows ``divopd tasks --for trinity`` writes, read by Trinity's own reader (``datasets``); HF models stand
in for Trinity's vLLM engines (they need a GPU). Every student turn becomes one ``Experience`` scored by the teacher;
the script prints each (rollout, turn, policy version, token counts, the action text, the teacher's mean log prob),
writes them into Trinity's real queue and prints the batch the ``divopd`` sample strategy composes and its metrics.
Nothing is written outside the temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path


async def compose(experiences: list, folder: Path, batch_size: int) -> tuple[list, dict]:
    """The experiences into Trinity's queue (its writer), then one batch from the ``divopd`` sample strategy."""
    import ray
    from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY
    from trinity.buffer import get_buffer_writer
    from trinity.common.config import BufferConfig, ExperienceBufferConfig

    import divopd.integrations.trinity  # noqa: F401  (registers the "divopd" strategy)

    config = BufferConfig(train_batch_size=batch_size)
    config.trainer_input.experience_buffer = ExperienceBufferConfig(
        name="divopd-try", storage_type="queue", path=str(folder / "queue.jsonl"), max_read_timeout=30)
    writer = get_buffer_writer(config.trainer_input.experience_buffer)
    await writer.acquire()
    try:
        await writer.write(experiences)
        strategy = SAMPLE_STRATEGY.get("divopd")(buffer_config=config, method="divopd", pool_factor=2, cap=2)
        batch, metrics, _ = await strategy.sample(1)
        return batch, metrics
    finally:
        await writer.release()
        ray.kill(writer.queue)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2, help="tasks to play (one run each)")
    parser.add_argument("--max-steps", type=int, default=4, help="turns per run at most (the env's horizon)")
    parser.add_argument("--batch-size", type=int, default=4, help="train_batch_size of the batch the strategy composes")
    args = parser.parse_args()

    import datasets
    import ray
    from transformers.utils import logging as hf_logging

    # first: without vLLM (a CPU) it registers import-only placeholders for the vLLM modules Trinity imports
    from divopd.integrations.trinity_try import engines, play_tasks, trinity_config

    # isort: split
    from trinity.common.workflows import WORKFLOWS, Task

    import divopd.integrations.trinity_workflow  # noqa: F401  (registers the divopd_* workflows)
    from divopd.commands.tasks import task_rows
    from divopd.explore.envs.tiny import build_tiny_pair
    from divopd.integrations.trinity_tasks import write_tasks
    from divopd.train.config import load_config

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    cfg = load_config("tiny", ["explorer.env=tiny", "explorer.env_kwargs={}", f"explorer.max_steps={args.max_steps}",
                               "explorer.generation.max_new_tokens=4"])
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            models = build_tiny_pair(folder / "models")
            (folder / "tasks").mkdir()
            write_tasks(task_rows(cfg, "train", limit=args.tasks), folder / "tasks" / "train.jsonl")
            rows = datasets.load_dataset(str(folder / "tasks"), split="train")  # what Trinity's task reader does
            tasks = [Task(workflow=WORKFLOWS.get("divopd_opd_workflow"), raw_task=row) for row in rows]
            config = trinity_config(models)
            actors = engines(config, models, os.pathsep.join(sys.path))
            try:
                experiences = asyncio.run(play_tasks(config, tasks))
                scored = ray.get(actors[1].__ray_call__.remote(lambda engine: engine.scored))
            finally:
                for actor in actors:
                    ray.kill(actor)
            print(f"{len(experiences)} experiences from {len(tasks)} runs of {cfg.explorer.env} "
                  f"(teacher scorings: {scored}):")
            for e in sorted(experiences, key=lambda e: (e.eid.task, e.eid.step)):
                n = len(e.tokens) - e.prompt_length
                print(f"  task {e.eid.task} turn {e.eid.step}: version {e.info['divopd_policy_version']}, "
                      f"{e.prompt_length} prompt + {n} response tokens, action {e.response_text.strip()!r}, "
                      f"teacher mean log prob {float(e.teacher_logprobs.mean()):.2f}")
            batch, metrics = asyncio.run(compose(experiences, folder, min(args.batch_size, len(experiences))))
            print("the batch DivOPD composes for Trinity's trainer: "
                  + str([f"task {e.eid.task} turn {e.eid.step}" for e in batch]))
            shown = ("sampler/effective_rollouts", "sampler/max_rollout_share", "ledger/received", "ledger/selected",
                     "sampler/teacher_masked_tokens")
            print("  " + ", ".join(f"{k} {metrics[k]:g}" for k in shown if k in metrics))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
