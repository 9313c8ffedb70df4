"""Try divopd's verl agent loop on a CPU and see the records it hands verl's trainer.

Run from the repository root, in the verl venv (make setup-verl):

    PYTHONPATH=src .venv-verl/bin/python examples/try_verl.py --tasks 2

verl 0.9.1's real TQ agent-loop worker (divopd's override) plays divopd's ``tiny`` env (the packaged ``tiny``
setting: random tiny student and teacher, built in a temporary folder) for ``--tasks`` tasks, one session each,
through verl's server client; HF models stand in for verl's vLLM servers (they need a GPU). Every student turn
becomes one TransferQueue record scored by verl's teacher path; the script prints each record (key, weights
version, token counts, the action text, the teacher's mean log prob), then the batch the DivOPD buffer composes
from them and its metrics. Nothing is written outside the temporary folder.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2, help="tasks to play (one session each)")
    parser.add_argument("--max-steps", type=int, default=4, help="turns per session at most (the env's horizon)")
    parser.add_argument("--batch-size", type=int, default=4, help="B of the batch the buffer composes")
    args = parser.parse_args()

    import ray
    import torch
    import transfer_queue as tq
    from transformers import PreTrainedTokenizerFast

    from divopd.commands.tasks import task_rows
    from divopd.explore.envs.tiny import build_tiny_pair
    from divopd.integrations.verl import DivOPDReplayBuffer
    from divopd.integrations.verl_records import SUMMARY_TAG
    from divopd.integrations.verl_try import play_prompts, worker
    from divopd.train.config import load_config

    torch.set_num_threads(1)
    cfg = load_config("tiny", ["explorer.env=tiny", "explorer.env_kwargs={}", f"explorer.max_steps={args.max_steps}"])
    rows = task_rows(cfg, "train", limit=args.tasks)
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    tq.init()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            models = build_tiny_pair(Path(tmp))
            tokenizer = PreTrainedTokenizerFast.from_pretrained(models["student"])
            agent, _, teacher = worker(models, cfg.explorer.generation.max_new_tokens)
            play_prompts(agent, [{"uid": f"task{i}", "row": row} for i, row in enumerate(rows)])
            listing = tq.kv_list(partition_id="train")["train"]
            # records are keyed {uid}_{session}_{turn}; the prompts' own entries are keyed {uid}
            keys = sorted((k for k in listing if k.count("_") >= 2),
                          key=lambda k: (k.rsplit("_", 1)[0], int(k.rsplit("_", 1)[1])))
            data = tq.kv_batch_get(keys=keys, partition_id="train",
                                   select_fields=["prompts", "responses", "teacher_logprobs"])
            print(f"{len(keys)} records from {len(rows)} sessions of {cfg.explorer.env} "
                  f"(teacher calls: {teacher.calls}):")
            for i, key in enumerate(keys):
                tag = listing[key]
                p, n = len(data["prompts"][i]), len(data["responses"][i])
                teacher_rows = data["teacher_logprobs"][i][p - 1:p - 1 + n, 0]
                text = tokenizer.decode(data["responses"][i].tolist(), skip_special_tokens=True).strip()
                print(f"  {key}: version {tag['min_global_steps']}, {p} prompt + {n} response tokens, "
                      f"action {text!r}, teacher mean log prob {float(teacher_rows.mean()):.2f}, "
                      f"valid tokens {tag[SUMMARY_TAG]['n_valid']}")
            buffer = DivOPDReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=3,
                                        max_off_policy_strategy="drop", sampler_kwargs={"method": "divopd"},
                                        poll_interval=0.01, refill_fn=None)
            batch, metrics = buffer.sample_nowait(global_steps=1, partition_id="train",
                                                  batch_size=min(args.batch_size, len(keys)))
            if batch is None:
                print("the buffer composed no batch (too few valid turns)")
            else:
                print(f"the batch DivOPD composes for verl's trainer: {batch.keys}")
                shown = ("sampler/effective_rollouts", "sampler/max_rollout_share", "ledger/received",
                         "ledger/selected", "sampler/teacher_masked_tokens")
                print("  " + ", ".join(f"{k} {metrics[k]:g}" for k in shown if k in metrics))
            tq.kv_clear(keys=list(listing), partition_id="train")
    finally:
        tq.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
