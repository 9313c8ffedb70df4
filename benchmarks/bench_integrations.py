"""The plug-ins' speed: the framework's own sampler against divopd's, side by side on one turn stream, in one run.

Each framework runs in its own venv, so the benchmark runs once per framework:

    .venv-trinity/bin/python benchmarks/bench_integrations.py --framework trinity
    .venv-verl/bin/python benchmarks/bench_integrations.py --framework verl

Rows: B in {64, 256}, the buffer preloaded (every turn in the framework's buffer before the first step) or fed tick by
tick (each step's arrivals written just before that step's ``sample()``), median and p90 wall time of one ``sample()``
per step for the framework's default sampler and for divopd's, on the same stream. ``--stream damaged`` is the
stream a long asynchronous run delivers: 2.5 × the arrivals, about half of them from policies too old (they expire
as stale before they are selected) and about 9% invalid (missing teacher, length mismatch, truncated prompt, no
valid token); divopd reads all of them into its pool. Target: divopd's median
<= 1.05 x the default's + 5 ms in every row. The measuring code for each framework lives beside this file
(``bench_integrations_trinity.py``, ``bench_integrations_verl.py``), each exposing ``measure(batch_sizes, feeds,
steps, seed) -> list[Row]``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

FRAMEWORKS = {"trinity": "bench_integrations_trinity", "verl": "bench_integrations_verl"}
FEEDS = ("preloaded", "ticks")
STREAMS = ("clean", "damaged")


@dataclass
class Row:
    """One framework × B × feed: ``sample()`` wall times in milliseconds, the default's and divopd's."""

    framework: str
    stream: str
    batch_size: int
    feed: str
    steps: int
    default_median_ms: float
    default_p90_ms: float
    divopd_median_ms: float
    divopd_p90_ms: float
    default_read: float | None = None  # experiences taken out of the framework's buffer per timed step (mean)
    divopd_read: float | None = None

    @property
    def target_ms(self) -> float:
        return 1.05 * self.default_median_ms + 5.0

    @property
    def meets_target(self) -> bool:
        return self.divopd_median_ms <= self.target_ms


def print_table(rows: list[Row]) -> None:
    """The markdown table docs/performance.md quotes."""
    print("| framework | stream | B | feed | steps | default median (p90) ms | divopd median (p90) ms | target ms | ok "
          "| read/step default, divopd |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        reads = "–" if r.default_read is None else f"{r.default_read:.0f}, {r.divopd_read:.0f}"
        print(f"| {r.framework} | {r.stream} | {r.batch_size} | {r.feed} | {r.steps} | {r.default_median_ms:.1f} "
              f"({r.default_p90_ms:.1f}) | {r.divopd_median_ms:.1f} ({r.divopd_p90_ms:.1f}) | {r.target_ms:.1f} | "
              f"{'yes' if r.meets_target else 'NO'} | {reads} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), required=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--feeds", nargs="+", choices=FEEDS, default=list(FEEDS))
    parser.add_argument("--steps", type=int, default=40, help="timed sample() calls per row and sampler")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream", choices=STREAMS, default="clean",
                        help="clean, or damaged: half the arrivals stale, about 9%% invalid")
    parser.add_argument("--arrival", type=float, default=1.0,
                        help="turns arriving per step as a multiple of B (1.0: explorer matched to the trainer)")
    parser.add_argument("--json", action="store_true", help="one JSON line per row after the table")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    module = importlib.import_module(FRAMEWORKS[args.framework])
    extra: dict = {"damaged": args.stream == "damaged"}
    if args.arrival != 1.0:
        if "arrival" not in inspect.signature(module.measure).parameters:
            parser.error(f"--arrival is not supported for --framework {args.framework}")
        extra["arrival"] = args.arrival
    rows: list[Row] = module.measure(args.batch_sizes, args.feeds, args.steps, args.seed, **extra)
    print_table(rows)
    if args.json:
        import json

        for r in rows:
            print(json.dumps({**asdict(r), "target_ms": r.target_ms, "meets_target": r.meets_target}))
    return 0 if all(r.meets_target for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
