"""Full fine-tuning vs LoRA students (``student.lora.rank``) on SmolLM2-135M, side by side in one run.

For each variant (``full``, then each ``--ranks`` value) a fresh child process loads the model, wraps it (LoRA: PEFT
adapters on every linear layer but the head, α = 2·rank) and measures:

* ``step s`` — median ``Learner.step`` seconds on one batch of synthetic multi-turn rows (after one warm-up step);
  ``--step-times ROUNDS`` measures the variants' steps interleaved in one process instead, wall and CPU seconds;
* ``peak RSS`` — the process's peak resident memory while the steps run (sampled every 5 ms);
* ``optimizer`` — bytes of AdamW state (moments of the trainable tensors);
* ``checkpoint`` — bytes ``save_checkpoint`` writes (weights or adapter, optimizer, state);
* ``publish HF`` — median seconds of ``learner.publish()`` plus an HF explorer copy loading the handle;
* ``publish vLLM`` — (with vllm importable) seconds from a weight update call to the first generated token on a CPU
  engine: ``update_weights`` of the whole model (full), or ``update_adapter`` of the adapter, on an engine with
  ``enable_lora`` (a ``LoRARequest`` per version: ``vLLM/request``) and on one without (merged into the base and
  reloaded in place: ``vLLM/merged``), minus the same one-token generation without an update.

The model folder is built offline as the Makefile's ``cache/smollm2-135m`` target does
(``benchmarks/build_smollm2.py``).

Usage: ``.venv-vllm/bin/python benchmarks/bench_lora.py [--model cache/smollm2-135m] [--ranks 8 64] [--rows 8]
[--steps 3] [--no-vllm] [--step-times ROUNDS]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def synthetic_turns(vocab: int, rows: int, seed: int = 0) -> list[Any]:
    """Rows of rollouts of 4 turns: prompt = 64 + 32·turn tokens, response 8 tokens, all teacher-scored."""
    import numpy as np

    from divopd import Turn

    rng = np.random.default_rng(seed)
    turns = []
    for i in range(rows):
        turn = i % 4
        p, r = 64 + 32 * turn, 8
        turns.append(Turn(f"r{i // 4}", turn, 0, rng.integers(6, vocab, size=p), rng.integers(6, vocab, size=r),
                          student_logprobs=-rng.random(r) * 3, teacher_logprobs=-rng.random(r) * 3))
    return turns


class PeakRSS:
    """The peak resident set size of this process while the context runs (sampled every 5 ms)."""

    def __enter__(self) -> PeakRSS:
        import psutil

        self._proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def learner_variant(model_path: str, rank: int, rows: int, steps: int) -> dict[str, Any]:
    """One variant's learner numbers (run in its own process)."""
    import torch

    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.learn.lora import LoraSettings, add_adapter
    from divopd.models import load_model

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    model, tok = load_model(model_path)
    if rank:
        add_adapter(model, LoraSettings(rank=rank), base=model_path)
    learner = Learner(model, LearnerConfig(lr=1e-5 if not rank else 1e-4), tok)
    turns = synthetic_turns(model.get_input_embeddings().num_embeddings, rows)
    learner.step(turns)  # warm-up (allocates the AdamW moments)
    times = []
    with PeakRSS() as rss:
        for _ in range(steps):
            t0 = time.perf_counter()
            learner.step(turns)
            times.append(time.perf_counter() - t0)
    optim = sum(t.numel() * t.element_size() for s in learner.optimizer.state.values() for t in s.values()
                if torch.is_tensor(t))
    with tempfile.TemporaryDirectory() as d:
        learner.save_checkpoint(Path(d) / "ckpt")
        ckpt = _folder_bytes(Path(d) / "ckpt")
    explorer, _ = load_model(model_path)
    publish = []
    for _ in range(3):
        t0 = time.perf_counter()
        learner.publish().load_into(explorer)
        publish.append(time.perf_counter() - t0)
    trainable = sum(p.numel() for p in learner.params)
    return {"variant": "full" if not rank else f"rank {rank}", "trainable": trainable,
            "step_s": statistics.median(times), "peak_rss": rss.peak, "optimizer_bytes": optim,
            "checkpoint_bytes": ckpt, "publish_hf_s": statistics.median(publish)}


def interleaved_steps(model_path: str, ranks: list[int], rows: int, rounds: int) -> list[dict[str, Any]]:
    """Step time of every variant in one process, their steps interleaved (full, rank a, rank b, full, ...), as wall
    and CPU seconds (this process's user + system time): on a machine shared with other jobs the wall time follows
    the load, the CPU time much less."""
    import torch

    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.learn.lora import LoraSettings, add_adapter
    from divopd.models import load_model

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    learners = []
    for rank in [0, *ranks]:
        model, tok = load_model(model_path)
        if rank:
            add_adapter(model, LoraSettings(rank=rank), base=model_path)
        learners.append((rank, Learner(model, LearnerConfig(lr=1e-5 if not rank else 1e-4), tok)))
    turns = synthetic_turns(learners[0][1].model.get_input_embeddings().num_embeddings, rows)
    times: dict[int, list[tuple[float, float]]] = {rank: [] for rank, _ in learners}
    for r in range(rounds + 1):  # round 0 warms up (allocates the AdamW moments)
        for rank, learner in learners:
            w0, c0 = time.perf_counter(), time.process_time()
            learner.step(turns)
            if r:
                times[rank].append((time.perf_counter() - w0, time.process_time() - c0))
    return [{"variant": "full" if not rank else f"rank {rank}",
             "wall_s": statistics.median(t[0] for t in ts), "cpu_s": statistics.median(t[1] for t in ts)}
            for rank, ts in times.items()]


def vllm_variant(model_path: str, rank: int, per_request: bool) -> float:
    """Seconds from a weight update to the first generated token on a CPU engine, minus a bare one-token call."""
    import torch

    from divopd.explore.vllm_engine import VLLMGenerator, lora_engine_kwargs
    from divopd.learn.lora import LoraSettings, adapter_settings, add_adapter, published_weights
    from divopd.models import load_model

    extra = lora_engine_kwargs(rank) if rank and per_request else {}
    gen = VLLMGenerator(model_path, dtype="float32", max_model_len=512, enforce_eager=True,
                        kv_cache_memory_bytes=2**28, **extra)
    model, tok = load_model(model_path)
    if rank:
        add_adapter(model, LoraSettings(rank=rank), base=model_path)
    prompt = [tok.encode("You are in the kitchen. Valid actions: move east, take coin")]
    gen.generate(prompt, greedy=True, max_new_tokens=1)
    out = []
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(1e-3)  # a new version
        t0 = time.perf_counter()
        gen.generate(prompt, greedy=True, max_new_tokens=1)
        bare = time.perf_counter() - t0
        t0 = time.perf_counter()
        if rank:
            gen.update_adapter(published_weights(model), adapter_settings(model) or {}, version=version)
        else:
            gen.update_weights(published_weights(model), version=version)
        gen.generate(prompt, greedy=True, max_new_tokens=1)
        out.append(time.perf_counter() - t0 - bare)
    gen.close()
    return statistics.median(out)


def _child(args: list[str]) -> Any:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bench_lora child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} KB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / "cache" / "smollm2-135m"))
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--step-times", type=int, metavar="ROUNDS", help="only the interleaved step times, ROUNDS each")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, rank = args.child[0], int(args.child[1])
        if kind == "learner":
            print(json.dumps(learner_variant(args.model, rank, args.rows, args.steps)))
        else:
            print(json.dumps(vllm_variant(args.model, rank, kind == "vllm-request")))
        return 0
    if not (Path(args.model) / "config.json").is_file():
        print(f"{args.model}: no model folder (build it: make cache/smollm2-135m/config.json)", file=sys.stderr)
        return 2
    if args.step_times:
        print("| variant | step wall s | step CPU s |\n|---|---|---|")
        for r in interleaved_steps(args.model, args.ranks, args.rows, args.step_times):
            print(f"| {r['variant']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} |")
        return 0
    try:
        import vllm  # noqa: F401

        with_vllm = not args.no_vllm
    except ImportError:
        with_vllm = False
    rows = []
    for rank in [0, *args.ranks]:
        common = ["--model", args.model, "--rows", str(args.rows), "--steps", str(args.steps)]
        row = _child([*common, "--child", "learner", str(rank)])
        if with_vllm:
            if rank:
                row["publish_vllm_request_s"] = _child([*common, "--child", "vllm-request", str(rank)])
            row["publish_vllm_merged_s"] = _child([*common, "--child", "vllm-merged", str(rank)])
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    full = rows[0]
    head = ["variant", "trainable", "step s", "peak RSS", "optimizer", "checkpoint", "publish HF s"]
    if with_vllm:
        head += ["publish vLLM/request s", "publish vLLM/merged s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        cells = [r["variant"], f"{r['trainable']:,}", f"{r['step_s']:.2f}", _mb(r["peak_rss"]),
                 f"{_mb(r['optimizer_bytes'])} ({full['optimizer_bytes'] / max(r['optimizer_bytes'], 1):.0f}× less)"
                 if r is not full else _mb(r["optimizer_bytes"]),
                 f"{_mb(r['checkpoint_bytes'])} ({full['checkpoint_bytes'] / r['checkpoint_bytes']:.0f}× less)"
                 if r is not full else _mb(r["checkpoint_bytes"]),
                 f"{r['publish_hf_s']:.3f}"]
        if with_vllm:
            req = r.get("publish_vllm_request_s")
            cells += ["—" if req is None else f"{req:.3f}", f"{r['publish_vllm_merged_s']:.3f}"]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
