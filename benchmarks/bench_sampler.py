"""Sampler speed: median wall time of one ``next_batch`` per method, in steady state, and the per-turn intake cost.

Steady state: the sampler already holds a full candidate pool (``pool_factor × B`` turns, pending and queued), and
before every timed ``next_batch`` the explorers deliver B fresh turns (``add``), so each call gates B new turns into
the pool, composes B rows and keeps the rest pending. Learner and generating versions stay equal, so nothing
expires and the pool stays full (the stale scan still runs over every pending turn).

Where the per-turn work happens matters: ``add()`` reads each turn once into its ``Candidate`` (derived fields, focus
score, gate verdict) and a row of the numpy columns, so ``next_batch`` works on the columns only. The intake table
reports that per-turn cost (``add()`` of freshly built turns) next to the cost of building a ``Turn`` itself.

Each cell also times the previous sampler (list composers and per-rule selectors, kept as the test oracle in
``tests/sampler_oracle``) on the same turns in the same run, in brackets.

Turns: rollouts of 1–30 turns, response lengths 16–256 tokens, 5% invalid (no scored token / truncated prompt).

Run: ``.venv/bin/python benchmarks/bench_sampler.py`` (``--quick`` for a fast check).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from divopd import Turn
from divopd.sampling import SamplerConfig, make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import sampler_oracle.rows  # noqa: E402, F401 — fills the previous sampler's method table
from sampler_oracle.sampler import SamplerConfig as OldConfig  # noqa: E402
from sampler_oracle.sampler import make_sampler as old_sampler  # noqa: E402

#: name -> builds a sampler from (method, batch_size, pool_factor): the current one and the previous one
SAMPLERS: dict[str, Callable] = {
    "new": lambda m, b, c: make_sampler(SamplerConfig(m, b, pool_factor=c, cap=4, max_staleness=2)),
    "old": lambda m, b, c: old_sampler(OldConfig(m, b, pool_factor=c, cap=4, max_staleness=2)),
}

METHODS = ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "divopd-focus", "top-b")


class TurnFactory:
    """Builds realistic turns quickly: token arrays are views into shared random buffers (no per-turn copies)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.ids = self.rng.integers(0, 150_000, 1 << 20, dtype=np.int32)
        self.student = -self.rng.exponential(0.5, 1 << 20).astype(np.float32)
        self.teacher = -self.rng.exponential(0.8, 1 << 20).astype(np.float32)
        self.prompt = np.arange(512, dtype=np.int32)
        self.rollouts = 0
        self.left = 0
        self.turn_index = 0

    def make(self, n: int, version: int = 0) -> list[Turn]:
        rng = self.rng
        lengths = rng.integers(16, 257, n).tolist()
        starts = rng.integers(0, (1 << 20) - 256, n).tolist()
        defects = (rng.random(n) < 0.05).tolist()
        out = []
        for length, start, bad in zip(lengths, starts, defects, strict=True):
            if self.left == 0:
                self.rollouts += 1
                self.left = int(rng.integers(1, 31))
                self.turn_index = 0
            sl = slice(start, start + length)
            out.append(
                Turn(
                    rollout_id=f"rollout-{self.rollouts:07d}",
                    turn_index=self.turn_index,
                    policy_version=version,
                    prompt_ids=self.prompt,
                    response_ids=self.ids[sl],
                    student_logprobs=self.student[sl],
                    teacher_logprobs=self.teacher[sl],
                    prompt_truncated=bad,
                )
            )
            self.left -= 1
            self.turn_index += 1
        return out


def time_next_batch(method: str, batch_size: int, pool_factor: float, calls: int, factory: TurnFactory,
                    base: list[Turn], which: str = "new") -> tuple[list[float], list[float]]:
    """CPU and wall seconds of each steady-state ``next_batch``, sorted; ``base`` fills the pool first (untimed).

    CPU time (``time.process_time``) is the headline: on a shared machine, wall time also counts the time other
    processes hold the core.
    """
    sampler = SAMPLERS[which](method, batch_size, pool_factor)
    sampler.add(base)
    sampler.next_batch(0)  # the pool is now full: pending + queued
    # a few more than B per call, so that the ~5% invalid arrivals do not slowly drain the pool
    fresh = [factory.make(batch_size + batch_size // 16) for _ in range(calls)]
    gc.collect()
    gc.freeze()  # the pre-built turns are the benchmark's, not the sampler's: keep them out of the cyclic GC's scans
    cpu, wall = [], []
    for arrivals in fresh:
        sampler.add(arrivals)
        c0, w0 = time.process_time(), time.perf_counter()
        batch = sampler.next_batch(0)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        assert batch is not None and len(batch) == batch_size
    gc.unfreeze()
    return sorted(cpu), sorted(wall)


def time_intake(factory: TurnFactory, n: int) -> tuple[float, dict[str, float]]:
    """CPU seconds per turn to build a ``Turn`` and to ``add()`` it (derived fields + gate verdict computed there),
    for each sampler (fresh turns each: a turn caches its derived fields)."""
    t0 = time.process_time()
    factory.make(n)
    build = (time.process_time() - t0) / n
    add = {}
    for which, make in SAMPLERS.items():
        turns, sampler = factory.make(n), make("divopd", 256, 4)
        t0 = time.process_time()
        sampler.add(turns)
        add[which] = (time.process_time() - t0) / n
    return build, add


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="pools 1024 and 4096 only, fewer calls")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--pools", type=int, nargs="*", help="pool sizes c·B (default 1024 ... 100,000)")
    args = parser.parse_args()
    batch_size = args.batch_size
    pools = [4 * batch_size, 16 * batch_size] if args.quick else [1024, 4096, 16384, 65536, 100_000]
    pools = args.pools or pools
    console = Console(width=160)
    factory = TurnFactory()

    build, add = time_intake(factory, 2000 if args.quick else 20000)
    intake = Table(title="Per-turn intake cost (CPU µs per turn)")
    intake.add_column("build Turn")
    intake.add_column("add(): candidate + columns (previous sampler)")
    intake.add_row(f"{build * 1e6:.1f}", f"{add['new'] * 1e6:.1f} ({add['old'] * 1e6:.1f})")
    console.print(intake)

    table = Table(title=f"Median CPU ms per next_batch (previous sampler in brackets), B={batch_size}, steady state")
    table.add_column("pool (c·B)", justify="right")
    table.add_column("c", justify="right")
    for m in args.methods:
        table.add_column(m, justify="right")
    results: dict[tuple[str, int], float] = {}
    spread: dict[str, list[float]] = {}
    for pool in pools:
        pool_factor = pool / batch_size
        calls = 10 if args.quick else max(7, min(60, 400_000 // pool))
        base = factory.make(pool)
        row = [f"{pool:,}", f"{pool_factor:g}"]
        for m in args.methods:
            cpu, _ = time_next_batch(m, batch_size, pool_factor, calls, factory, base)
            old, _ = time_next_batch(m, batch_size, pool_factor, calls, factory, base, "old")
            results[(m, pool)] = statistics.median(cpu)
            row.append(f"{statistics.median(cpu) * 1e3:.2f} ({statistics.median(old) * 1e3:.2f})")
            if pool == pools[0]:
                spread[m] = [cpu[0], statistics.median(cpu), cpu[int(0.9 * (len(cpu) - 1))]]
        table.add_row(*row)
        console.print(f"[dim]pool {pool}: done ({calls} timed calls per method)[/dim]")
    console.print(table)
    first = Table(title=f"Pool {pools[0]}: CPU ms per next_batch, min / median / p90 over the timed calls")
    first.add_column("method")
    first.add_column("min / median / p90", justify="right")
    for m, values in spread.items():
        first.add_row(m, " / ".join(f"{v * 1e3:.2f}" for v in values))
    console.print(first)

    if len(pools) > 1:
        growth = Table(title=f"Growth of CPU time: time(n) / time({pools[0]}) vs n/n0 and n·log n / (n0·log n0)")
        growth.add_column("pool", justify="right")
        growth.add_column("n/n0", justify="right")
        growth.add_column("n log n ratio", justify="right")
        for m in args.methods:
            growth.add_column(m, justify="right")
        n0 = pools[0]
        for pool in pools[1:]:
            ratio = pool * math.log(pool) / (n0 * math.log(n0))
            cells = [f"{results[(m, pool)] / results[(m, n0)]:.1f}" for m in args.methods]
            growth.add_row(f"{pool:,}", f"{pool / n0:.1f}", f"{ratio:.1f}", *cells)
        console.print(growth)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
