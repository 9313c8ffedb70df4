"""Benchmark: replay 3 methods over a 10^6-turn experience log in bounded memory (wall time, peak RSS).

    .venv/bin/python benchmarks/bench_replay.py                    # 10^5 and 10^6 turns, alfworld preset
    .venv/bin/python benchmarks/bench_replay.py --turns 200000     # a quicker look

Logs are written once by ``divopd simulate`` (cached in --work-dir). Each replay runs in a fresh child process so
its peak RSS (``ru_maxrss``) is its own; equal peaks at 10^5 and 10^6 turns show the replay streams the log.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from divopd.analysis.simulate import PRESETS, expected_horizon, simulate


def child(log: str, updates: int, methods: str, batch_size: int) -> None:
    """Run in a fresh process: replay and print wall time and peak RSS as JSON."""
    from divopd.analysis.replay import ReplayConfig, replay

    t0 = time.perf_counter()
    result = replay(log, ReplayConfig(methods=methods.split(","), batch_size=batch_size, updates=updates))
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss_mb = usage.ru_maxrss / 1024  # Linux: KiB
    cpu = usage.ru_utime + usage.ru_stime  # robust to other processes on a shared machine
    summary = {
        m: {k: r[k] for k in ("updates", "unused_fraction", "effective_rollouts_mean", "selected", "expired")}
        for m, r in result["methods"].items()
    }
    print(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "peak_rss_mb": rss_mb,
                "turns": result["delivered_turns"],
                "methods": summary,
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--preset", default="alfworld", choices=sorted(PRESETS))
    parser.add_argument("--methods", default="vanilla,divopd-base,divopd")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--work-dir", default="runs/bench-replay")
    parser.add_argument("--child", nargs=2, metavar=("LOG", "UPDATES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.methods, args.batch_size)
        return 0

    preset = PRESETS[args.preset]
    turns_per_update = preset.default_rollouts_per_update * expected_horizon(preset)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.turns:
        updates = max(1, round(n / turns_per_update))
        log = work / f"{args.preset}-{updates}.parquet"
        if not log.exists():
            t0 = time.perf_counter()
            s = simulate(preset, log, updates=updates, seed=0, batch_size=args.batch_size)
            print(f"simulated {s.turns} turns / {updates} updates in {time.perf_counter() - t0:.1f}s -> {log}")
        cmd = [sys.executable, __file__, "--child", str(log), str(updates), "--methods", args.methods,
               "--batch-size", str(args.batch_size)]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ}).stdout
        r = json.loads(out.strip().splitlines()[-1])
        r.update(updates=updates, log_mb=log.stat().st_size / 2**20)
        rows.append(r)
        print(json.dumps(r))
    print()
    print("| turns | updates | log size | methods | wall time | CPU time (process) | turns/CPU-s | peak RSS |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['turns']:,} | {r['updates']} | {r['log_mb']:.0f} MiB | {args.methods} | {r['wall_s']:.1f} s | "
            f"{r['cpu_s']:.1f} s | {r['turns'] / r['cpu_s']:,.0f} | {r['peak_rss_mb']:.0f} MiB |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
