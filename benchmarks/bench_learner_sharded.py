"""The sharded learner (``learner.world_size``) vs the single-process learner on the same batch.

For each world size, the same synthetic batch (``bench_learner.synthetic_turns``: 8-turn rollouts, growing prompts)
is trained for ``--steps`` updates after one warm-up update; reported per world size:

* ``step s`` — median wall seconds of ``step`` in the driver (for N > 1: rows out, N ranks forward/backward on
  their rows, reduce-scatter, sharded clip + AdamW, log probs back);
* ``peak RSS / rank`` — each learner process's peak resident memory (N = 1: a fresh process running
  :class:`~divopd.learn.learner.Learner`; N > 1: every rank's own peak), including torch's ~300 MB of code;
* ``publish s`` — median seconds of ``publish()``: N = 1 copies the state dict, N > 1 gathers it on rank 0
  (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``) and loads it into the driver's copy;
* ``state MB / rank`` — parameters + gradients + AdamW moments held by one rank (fp32: 16 bytes per parameter ÷ N):
  the part of the memory that sharding divides.

Usage: ``.venv/bin/python benchmarks/bench_learner_sharded.py [--size 5m] [--rows 32] [--steps 3] [--world 1 2]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_learner import synthetic_turns  # noqa: E402
from divopd.learn.learner import Learner, LearnerConfig  # noqa: E402
from divopd.learn.sharded import ShardedLearner  # noqa: E402
from divopd.models.tiny import build_model, build_tokenizer  # noqa: E402


def _single(path: str, cfg: LearnerConfig, rows: int, steps: int, out: object) -> None:
    """Runs in a fresh process, so that its peak RSS is the learner's alone."""
    import resource

    from divopd.models import load_model

    torch.set_num_threads(1)
    model, tok = load_model(path)
    learner = Learner(model, cfg, tok)
    turns = synthetic_turns(model.get_input_embeddings().num_embeddings, rows)
    learner.step(turns)
    times, pubs = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        learner.step(turns)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        learner.publish()
        pubs.append(time.perf_counter() - t0)
    out.send({"step": statistics.median(times), "publish": statistics.median(pubs),  # type: ignore[attr-defined]
              "rss": [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0]})


def measure(path: str, cfg: LearnerConfig, rows: int, steps: int) -> dict[str, object]:
    if cfg.world_size == 1:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_single, args=(path, cfg, rows, steps, child))
        proc.start()
        result = parent.recv()
        proc.join()
        return result
    learner = ShardedLearner(path, cfg)
    try:
        turns = synthetic_turns(learner._vocab, rows)
        learner.step(turns)
        times, pubs = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            learner.step(turns)
            times.append(time.perf_counter() - t0)
            learner.publish()
            pubs.append(learner.last_publish_s)
        return {"step": statistics.median(times), "publish": statistics.median(pubs),
                "rss": [r.peak_rss_mb for r in learner.last_step]}
    finally:
        learner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="5m", help="tiny model size (0.2m, 1m, 5m, 20m)")
    ap.add_argument("--rows", type=int, default=32, help="batch rows B")
    ap.add_argument("--steps", type=int, default=3, help="timed updates per world size (after one warm-up)")
    ap.add_argument("--world", type=int, nargs="+", default=[1, 2], help="world sizes to measure")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = build_tokenizer([" ".join(f"w{i}" for i in range(1000))], kind="word")
    model = build_model(tok, size=args.size, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        print(f"model {args.size}: {n_params / 1e6:.2f} M parameters; batch {args.rows} rows; "
              f"median of {args.steps} updates; 1 torch thread per process")
        print("| world_size | step s | peak RSS / rank (MB) | publish s | state MB / rank |")
        print("|---|---|---|---|---|")
        for ws in args.world:
            cfg = LearnerConfig(lr=1e-4, world_size=ws)
            r = measure(tmp, cfg, args.rows, args.steps)
            rss = " / ".join(f"{x:.0f}" for x in r["rss"])  # type: ignore[union-attr]
            print(f"| {ws} | {r['step']:.3f} | {rss} | {r['publish']:.4f} | {16 * n_params / ws / 2**20:.1f} |")


if __name__ == "__main__":
    main()
