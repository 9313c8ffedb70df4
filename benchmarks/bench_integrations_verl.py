"""verl 0.9.1's default replay buffer against divopd's ``DivOPDReplayBuffer``, side by side on one turn stream through
verl's real TransferQueue (a local Ray, TransferQueue's controller and storage units). Loaded by
``bench_integrations.py --framework verl``; run it with the verl venv's python.

The stream: prompts of ``SESSIONS`` sessions x ``TURNS`` turns (prompt 96 tokens, response 16), one TransferQueue
record per turn, keyed ``{uid}_{session}_{turn}`` and tagged as divopd's agent loop writes it (``status``,
``min_global_steps``, divopd's summary tag), the teacher in verl's ``[prompt + response, 1]`` layout with
``teacher_ids``; after a prompt's records, its marker (``is_prompt``, ``status=finished``, ``global_steps``), as
verl's rollout side writes it (its ``global_steps`` the dispatch step, version + 1). ``arrival`` x B turns arrive
per step (whole prompts), versions lagging 0-2 behind the learner's version (``global_steps`` - 1). The default is
verl's async-trainer buffer (``ReplayBufferAsync``, staleness ``drop``, ``max_off_policy_threshold`` 3), divopd's the
plug-in with its derived ``max_staleness`` 2 (the same span). verl's buffer counts prompts: it is asked for
B / (SESSIONS x TURNS) prompts, which are B records; divopd's for B turns. ``preloaded``: every step's
arrivals put before the first ``sample()``; ``ticks``: each step's arrivals put just before that step's
``sample()``. After each step the batch's records are cleared, as verl's trainer does after its update (not timed).

verl's buffer lists every partition of TransferQueue, so the two samplers run one after the other on a cleared
TransferQueue. ``damaged`` (:func:`_stream`): 2.5 × the arrivals, every other prompt from policies 3-4 versions old
(stale at once), and each turn invalid with probability 0.09 (one of four defects; a record whose fields change shape
is put on its own). Every wait has a deadline: divopd's ``sample_timeout_s`` and a watchdog per row that dumps the
stacks and exits.
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from bench_integrations import Row
from divopd.integrations.verl import DivOPDReplayBuffer
from divopd.integrations.verl_records import SUMMARY_TAG, record_summary

SESSIONS, TURNS = 2, 4
PROMPT, RESPONSE = 96, 16
THRESHOLD = 3  # verl's max_off_policy_threshold; divopd's max_staleness = THRESHOLD - 1
PARTITION = "train"
ROW_DEADLINE_S = 300.0  # watchdog per row and sampler: dump the stacks and exit


Tick = tuple[list[str], dict[str, torch.Tensor], list[dict[str, Any]], list[tuple[str, dict[str, Any], dict[str, Any]]],
             list[str], list[dict[str, Any]]]


DEFECTS = ("missing_teacher", "length_mismatch", "prompt_truncated", "no_valid_token")


def _stream(batch_size: int, steps: int, seed: int, arrival: float, damaged: bool = False) -> list[Tick]:
    """Per step: the records that arrive before it (keys, stacked fields, tags), the records whose fields change
    shape (put one by one), and their prompts' markers."""
    rng = np.random.default_rng(seed)
    per_prompt = SESSIONS * TURNS
    prompts_per_step = -(-round(batch_size * arrival * (2.5 if damaged else 1)) // per_prompt)
    out, uid_n = [], 0
    for step in range(steps + 4):
        keys, rows, tags, markers, marker_tags, odd = [], [], [], [], [], []
        for _ in range(prompts_per_step):
            uid = f"p{uid_n:07d}"  # verl takes a prompt's uid as key.split("_")[0]: no underscore in it
            uid_n += 1
            lag = 3 + int(rng.integers(0, 2)) if damaged and uid_n % 2 else int(rng.integers(0, 3))
            version = max(0, step - lag)
            for s in range(SESSIONS):
                for t in range(TURNS):
                    prompt = rng.integers(1, 30000, PROMPT)
                    response = rng.integers(1, 30000, RESPONSE)
                    student = -rng.exponential(1.0, RESPONSE).astype(np.float32)
                    teacher = np.zeros(PROMPT + RESPONSE, dtype=np.float32)
                    teacher[PROMPT - 1:PROMPT - 1 + RESPONSE] = student - rng.exponential(0.5, RESPONSE)
                    fields = {
                        "prompts": torch.tensor(prompt, dtype=torch.int64),
                        "responses": torch.tensor(response, dtype=torch.int64),
                        "response_mask": torch.ones(RESPONSE, dtype=torch.int64),
                        "rollout_log_probs": torch.tensor(student),
                        "teacher_logprobs": torch.tensor(teacher[:, None]),
                        "teacher_ids": torch.tensor(
                            np.concatenate([prompt[1:], response, [0]])[:, None], dtype=torch.int32),
                    }
                    key = f"{uid}_{s}_{t}"
                    tag = {"status": "success", "prompt_len": PROMPT, "response_len": RESPONSE,
                           "seq_len": PROMPT + RESPONSE, "global_steps": version, "min_global_steps": version,
                           "max_global_steps": version, "prompt_truncated": False}
                    defect = DEFECTS[int(rng.integers(0, 4))] if damaged and rng.random() < 0.09 else None
                    if defect == "missing_teacher":
                        fields = {k: v for k, v in fields.items() if not k.startswith("teacher_")}
                    elif defect == "length_mismatch":
                        fields["rollout_log_probs"] = torch.cat([fields["rollout_log_probs"], torch.zeros(1)])
                    elif defect == "prompt_truncated":
                        tag["prompt_truncated"] = True
                    elif defect == "no_valid_token":
                        fields["response_mask"] = torch.zeros(RESPONSE, dtype=torch.int64)
                    tag[SUMMARY_TAG] = record_summary(key, tag, fields)[1]
                    if defect in ("missing_teacher", "length_mismatch"):
                        odd.append((key, fields, tag))
                        continue
                    keys.append(key)
                    rows.append(fields)
                    tags.append(tag)
            markers.append(uid)
            # the prompt's dispatch step: verl dispatches at global step v + 1 with weights version v
            marker_tags.append({"is_prompt": True, "status": "finished", "global_steps": version + 1})
        stacked = {name: torch.stack([r[name] for r in rows]) for name in rows[0]}
        out.append((keys, stacked, tags, odd, markers, marker_tags))
    return out


def _put(tick: Tick) -> None:
    """A tick's records, then its prompts' terminal markers (verl's order: trajectories before the status)."""
    keys, fields, tags, odd, markers, marker_tags = tick
    tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=TensorDict(fields, batch_size=[len(keys)]), tags=tags)
    for key, one, tag in odd:
        tq.kv_put(key=key, partition_id=PARTITION, fields=one, tag=tag)
    tq.kv_batch_put(keys=markers, partition_id=PARTITION, tags=marker_tags)


def _clear_all() -> None:
    """Clear every key of every partition: the next sampler starts on an empty TransferQueue."""
    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


def _buffer(kind: str) -> Any:
    common = {"trainer_mode": "async", "trainer_config": {}, "max_off_policy_threshold": THRESHOLD,
              "max_off_policy_strategy": "drop", "poll_interval": 0.005, "refill_fn": None}
    if kind == "default":
        return ReplayBufferAsync(sampler_kwargs={}, **common)
    return DivOPDReplayBuffer(sampler_kwargs={"method": "divopd", "pool_factor": 4, "cap": 4,
                                              "sample_timeout_s": 60.0}, **common)


def _time(kind: str, stream: list[Tick], batch_size: int, feed: str, steps: int) -> tuple[list[float], float]:
    """``sample()`` wall times (ms) and the records read per step (mean): the default's = the B it hands over,
    divopd's = the records it took into its sampler."""
    _clear_all()
    rb = _buffer(kind)
    ask = batch_size // (SESSIONS * TURNS) if kind == "default" else batch_size
    if feed == "preloaded":
        for tick in stream:
            _put(tick)
    times, handed = [], 0
    faulthandler.dump_traceback_later(ROW_DEADLINE_S, exit=True)
    try:
        for step in range(steps):
            if feed == "ticks":
                _put(stream[step])
            t0 = time.perf_counter()
            batch, _ = rb.sample(global_steps=step + 1, partition_id=PARTITION, batch_size=ask)
            times.append((time.perf_counter() - t0) * 1000)
            if len(batch.keys) != batch_size:
                raise RuntimeError(f"{kind} sampler handed {len(batch.keys)} records at step {step}, not {batch_size}")
            handed += len(batch.keys)
            tq.kv_clear(keys=list(batch.keys), partition_id=PARTITION)  # verl's trainer after its update
    finally:
        faulthandler.cancel_dump_traceback_later()
        _clear_all()
    read = handed / steps if kind == "default" else rb.sampler.ledger.received / steps
    return times, read


def measure(batch_sizes: list[int], feeds: list[str], steps: int, seed: int, arrival: float = 1.0,
            damaged: bool = False) -> list[Row]:
    for b in batch_sizes:
        if b % (SESSIONS * TURNS):
            raise SystemExit(f"--batch-sizes: {b} is not a multiple of {SESSIONS * TURNS} (sessions x turns per "
                             "prompt): verl's buffer hands whole prompts")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # TransferQueue's actors ask for 1 CPU each (3 in all): 4 logical CPUs fit them on a 2-core machine.
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=512 * 2**20, log_to_driver=False)
    rows = []
    try:
        tq.init()
        try:
            for b in batch_sizes:
                stream = _stream(b, steps, seed, arrival, damaged)
                for feed in feeds:
                    res, read = {}, {}
                    for kind in ("default", "divopd"):  # same stream, same machine, one after the other
                        ms, read[kind] = _time(kind, stream, b, feed, steps)
                        res[kind] = (statistics.median(ms), float(np.percentile(ms, 90)))
                        print(f"[verl] B={b} {feed} {kind}: median {res[kind][0]:.1f} ms", file=sys.stderr)
                    rows.append(Row("verl", "damaged" if damaged else "clean", b, feed, steps, *res["default"],
                                    *res["divopd"], default_read=read["default"], divopd_read=read["divopd"]))
        finally:
            tq.close()
    finally:
        ray.shutdown()
    return rows
