"""Benchmark: a long run's experience log as rollout-sized parts, compacted at each checkpoint, and as one file
(file count, bytes, ``divopd replay`` wall time), measured side by side in one run.

    .venv/bin/python benchmarks/bench_log_parts.py                     # 200 ALFWorld-preset updates
    .venv/bin/python benchmarks/bench_log_parts.py --updates 1000      # the issue's 1,000-update log

The log is simulated once by ``divopd simulate --preset alfworld`` (one file, cached in --work-dir). The same rows are
then written as a training run writes them: one whole part per queued rollout (``ExperienceLogWriter``, a part per
rollout), once left as they are and once compacted at every ``--checkpoint-every`` updates as a training run does at
each checkpoint (:meth:`~divopd.experience.log.ExperienceLogWriter.compact`). Each ``divopd replay`` (vanilla over the
whole log) runs as its own child process.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from divopd.analysis.simulate import simulate
from divopd.experience.log import ExperienceLogWriter


def write_as_run(single: Path, out: Path, checkpoint_every: int | None) -> float:
    """Write ``single``'s rows to the directory log ``out`` one rollout per part (rows in arrival order, a rollout's
    turns together), compacting at every ``checkpoint_every`` updates (``None``: never). Returns the seconds taken."""
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    writer = ExperienceLogWriter(out, rows_per_file=1 << 20)
    next_ckpt = checkpoint_every
    for batch in pq.ParquetFile(single).iter_batches(batch_size=1 << 15):
        ids = batch.column("rollout_id").to_pylist()
        updates = batch.column("arrival_update").to_numpy()
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or ids[i] != ids[start]:
                if next_ckpt is not None and updates[start] >= next_ckpt:
                    writer.compact()  # the checkpoint of update next_ckpt, before the turns that arrive after it
                    next_ckpt += checkpoint_every
                writer.write_batch(batch.slice(start, i - start))
                start = i
    if checkpoint_every is not None:
        writer.compact()  # the final checkpoint
    writer.close()
    return time.perf_counter() - t0


def replay_s(log: Path) -> float:
    """Wall seconds of ``divopd replay LOG --methods vanilla`` in a fresh process."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "divopd.cli", "replay", str(log), "--methods", "vanilla"], check=True,
                   capture_output=True)
    return time.perf_counter() - t0


def size(path: Path) -> tuple[int, int]:
    files = [path] if path.is_file() else [f for f in path.iterdir() if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=25, help="updates per checkpoint (the config default)")
    parser.add_argument("--work-dir", default="runs/bench-log-parts")
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    single = work / f"alfworld-{args.updates}.parquet"
    if not single.exists():
        s = simulate("alfworld", single, updates=args.updates, seed=0)
        print(f"simulated {s.turns:,} turns, {s.rollouts:,} rollouts, {args.updates} updates -> {single}")
    rows = []
    for name, path, every in (("rollout-sized parts", work / "parts", None),
                              (f"compacted every {args.checkpoint_every} updates", work / "compacted",
                               args.checkpoint_every)):
        write_s = write_as_run(single, path, every)
        rows.append((name, path, write_s))
    rows.append(("one file", single, None))
    print()
    print(f"ALFWorld preset, {args.updates} updates, {pq.read_metadata(single).num_rows:,} turns")
    print()
    print("| log | files | MiB | write as the run does | `divopd replay` (vanilla) |")
    print("|---|---:|---:|---:|---:|")
    for name, path, write_s in rows:
        n, b = size(path)
        written = "—" if write_s is None else f"{write_s:.1f} s"
        print(f"| {name} | {n:,} | {b / 2**20:.0f} | {written} | {replay_s(path):.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
