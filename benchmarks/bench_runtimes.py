"""Threads vs lockstep on the same config: producer load, policy lag and throughput, side by side in one run.

    python benchmarks/bench_runtimes.py [--updates 40] [--steps 8 16 32] [--out runs/bench-runtimes]

The config is the first demo's (the packaged setting tiny, method divopd: TextWorld-Express coin, 8 env instances, B =
32) with the demo's tiny models (prepared once under cache/demo, as `make demo` does). The threads runtime's load is set
by the machine (one explorer thread beside the learner); lockstep's by ``runtime.lockstep.env_steps_per_update``.
Printed per run: arrival/drain ratio, mean and max staleness of the consumed rows (learner − generating version), the
share of received turns that expired as stale, turns/s and wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from divopd.suite.models import prepare_models
from divopd.train import train
from divopd.train.config import load_config

REPO = Path(__file__).resolve().parents[1]


def measure(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r["kind"] == "update"]
    summary = json.loads((run_dir / "summary.json").read_text())
    ledger = summary["ledger"]
    return {
        "arrival_drain": summary["arrival_drain_ratio"],
        "mean_staleness": sum(r["sampler/mean_staleness"] for r in updates) / len(updates),
        "max_staleness": max(r["sampler/max_staleness"] for r in updates),
        "stale_expired": ledger["expired_by_reason"].get("stale", 0) / max(1, ledger["received"]),
        "turns_per_s": summary["turns"] / summary["elapsed_s"],
        "wall_s": summary["elapsed_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--steps", type=int, nargs="+", default=[8, 16, 32], help="lockstep env_steps_per_update")
    parser.add_argument("--out", default="runs/bench-runtimes")
    args = parser.parse_args()
    models = prepare_models(REPO / "cache" / "demo")
    out = Path(args.out)
    variants = [("threads", [])] + [(f"lockstep-{n}", ["runtime.kind=lockstep",
                                                      f"runtime.lockstep.env_steps_per_update={n}"])
                                    for n in args.steps]
    results = {}
    for name, extra in variants:
        run_dir = out / name
        if not (run_dir / "summary.json").is_file():
            cfg = load_config("tiny", ["method=divopd",
                f"updates={args.updates}", f"run_dir={run_dir}", "eval.at_start=false", "eval.every=1000",
                f"student.path={models['student']}", f"teacher.path={models['teacher']}", *extra])
            t0 = time.perf_counter()
            train(cfg)
            print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
        results[name] = measure(run_dir)
    print("\n| runtime | arrival/drain | mean staleness | max staleness | stale-expired | turns/s | wall s |")
    print("|---|---|---|---|---|---|---|")
    for name, m in results.items():
        print(f"| {name} | {m['arrival_drain']:.2f} | {m['mean_staleness']:.2f} | {m['max_staleness']:.0f} | "
              f"{100 * m['stale_expired']:.1f}% | {m['turns_per_s']:.1f} | {m['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
