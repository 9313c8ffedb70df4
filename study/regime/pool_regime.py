"""What sets the number of distinct rollouts among the c·B candidates (issue 17's "pool regime"), on `coin4`.

Short lockstep runs (20 updates, seed 0) of vanilla and divopd under producer variants, side by side; per-update means
after the first 5 updates of the sampler's batch stats:

- candidate rollouts: distinct rollouts among the candidates the reader saw (divopd: pending ∪ fresh, up to c·B = 128;
  vanilla: the B turns it read);
- effective rollouts per batch, (Σ p_r²)⁻¹, and the largest rollout share;
- arrival/drain at the end, and the share of received turns that expired stale;
- (``--measure``) candidate turns, turns per candidate rollout (the ratio of the two means) and the mean age of the
  trained turns in policy versions (``sampler/mean_staleness``).

    .venv/bin/python study/regime/pool_regime.py                  # all variants, ~15 min on 2 cores
    .venv/bin/python study/regime/pool_regime.py --variants envs8 turn32 --out runs/pool-regime

Runs that already have a summary.json in ``--out`` are read, not retrained. ``--measure RUN_DIR...`` trains nothing:
it prints the same per-update means for existing runs (e.g. a study's), averaged over the runs of each method.

    .venv/bin/python study/regime/pool_regime.py --measure runs/regime-coin6/coin6/*/seed*
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from divopd.analysis.report.load import load_run

#: variant name -> config overrides of the coin4 setting (on top of updates=20, eval.every=20)
VARIANTS: dict[str, dict[str, object]] = {
    "envs8": {},  # the setting itself: 8 instances, whole rollouts queued at their end
    "envs32": {"explorer.num_envs": 32},
    "envs64": {"explorer.num_envs": 64},
    "steps6": {"explorer.max_steps": 6},  # shorter failures
    "turn32": {"explorer.num_envs": 32, "explorer.enqueue": "turn"},  # every round's turns queued at once
    "pool8": {"sampler.pool_factor": 8},  # c = 8: 256 candidates (the paper's c is 4)
}
METHODS = ("vanilla", "divopd")
SKIP = 5


def train_variant(configs: str, method: str, overrides: dict[str, object], run_dir: Path) -> None:
    from divopd.train import train
    from divopd.train.config import load_config

    sets = [f"{k}={v}" for k, v in {"updates": 20, "eval.every": 20, **overrides}.items()]
    train(load_config(configs, [f"method={method}", *sets], data={"run_dir": str(run_dir)}))


def measure(run_dir: Path) -> dict[str, float]:
    run = load_run(run_dir)
    ups = run.updates
    evals = [e.sr / 100 for e in run.evals]
    tail = ups[SKIP:]

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in tail)

    last = ups[-1]
    return {
        "candidates": mean("sampler/candidates"),
        "candidate_rollouts": mean("sampler/candidate_rollouts"),
        "staleness": mean("sampler/mean_staleness"),
        "effective_rollouts": mean("sampler/effective_rollouts"),
        "max_rollout_share": mean("sampler/max_rollout_share"),
        "arrival_drain": last["queue/arrival_drain_ratio"],
        "expired_share": last["ledger/expired"] / max(1.0, last["ledger/received"]),
        "sr_start": evals[0], "sr_end": evals[-1],
    }


def print_measured(run_dirs: list[Path]) -> None:
    """Per-method means over existing runs (the method is the run directory's parent's name, as in a plan's layout)."""
    by_method: dict[str, list[dict[str, float]]] = {}
    for run_dir in run_dirs:
        by_method.setdefault(run_dir.parent.name, []).append(measure(run_dir))
    print("| method | runs | candidate rollouts | effective rollouts | largest share | arrival/drain | expired stale "
          "| candidate turns | turns per candidate rollout | age of trained turns |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method, rows in sorted(by_method.items()):
        m = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
        per_rollout = m["candidates"] / m["candidate_rollouts"] if m["candidate_rollouts"] else 0.0
        print(f"| {method} | {len(rows)} | {m['candidate_rollouts']:.1f} | {m['effective_rollouts']:.2f} "
              f"| {m['max_rollout_share']:.2f} | {m['arrival_drain']:.2f} | {m['expired_share']:.0%} "
              f"| {m['candidates']:.0f} | {per_rollout:.1f} | {m['staleness']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", type=Path, nargs="+", help="existing run directories: measure them, train nothing")
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--configs", default="coin4", help="a packaged setting or a setting file (default coin4)")
    ap.add_argument("--out", type=Path, default=Path("runs/pool-regime"))
    args = ap.parse_args()
    if args.measure:
        print_measured([d for d in args.measure if (d / "summary.json").is_file()])
        return
    results = {}
    for name in args.variants:
        for method in METHODS:
            run_dir = args.out / f"{name}-{method}"
            if not (run_dir / "summary.json").exists():
                train_variant(args.configs, method, VARIANTS[name], run_dir)
            results[(name, method)] = measure(run_dir)
    print("| variant | overrides | candidate rollouts vanilla / divopd | effective rollouts vanilla / divopd "
          "| largest share vanilla / divopd | arrival/drain | expired stale | held-out SR @0 → @20 vanilla / divopd |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.variants:
        v, d = results[(name, "vanilla")], results[(name, "divopd")]
        over = ", ".join(f"{k.split('.')[-1]}={x}" for k, x in VARIANTS[name].items()) or "(the setting)"
        print(f"| {name} | {over} | {v['candidate_rollouts']:.1f} / {d['candidate_rollouts']:.1f} "
              f"| {v['effective_rollouts']:.1f} / {d['effective_rollouts']:.1f} "
              f"| {v['max_rollout_share']:.2f} / {d['max_rollout_share']:.2f} | {d['arrival_drain']:.2f} "
              f"| {d['expired_share']:.0%} | {v['sr_start']:.0%} → {v['sr_end']:.0%} / {d['sr_end']:.0%} |")


if __name__ == "__main__":
    main()
