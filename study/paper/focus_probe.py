"""What does focus select? Replays vanilla, divopd-base and divopd over experience logs and describes the turns each
selects: mean cached disagreement Σ(student − teacher log prob), the share of selected turns with a negative
disagreement (the teacher rates the sampled tokens above the student: a positive sampled-token advantage, the turns
that teach the student what to do) and the mean response length.

    python study/paper/focus_probe.py runs/paper/coin2/*/seed*/experience

Sampler settings are the suite's (B = 32, c = 4, k = 4, S = 2); U = the log's last arrival update + 1.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from divopd.analysis.replay import deliveries
from divopd.experience.log import read_log
from divopd.sampling import SamplerConfig, make_sampler

METHODS = ("vanilla", "divopd-base", "divopd")


def probe(log: str, batch_size: int, pool_factor: float, cap: int, max_staleness: int) -> dict[str, tuple[float, ...]]:
    """Per method: (mean disagreement, share of negative-disagreement turns, mean response tokens) of its selection."""
    turns = list(read_log(log))
    updates = max(t.arrival_update for t in turns) + 1
    out = {}
    for method in METHODS:
        sampler = make_sampler(SamplerConfig(method=method, batch_size=batch_size, pool_factor=pool_factor, cap=cap,
                                             max_staleness=max_staleness, seed=0))
        chosen = []
        for j, arrivals in deliveries(iter(turns), updates):
            sampler.add([a.turn for a in arrivals])
            batch = sampler.next_batch(j)
            if batch is not None:
                chosen += [t for t in batch.payloads if np.isfinite(t.disagreement)]
        d = np.array([t.disagreement for t in chosen])
        n = np.array([len(t.response_ids) for t in chosen])
        out[method] = (float(d.mean()), float((d < 0).mean()), float(n.mean()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="experience logs (run_dir/experience)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pool-factor", type=float, default=4)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=2)
    args = parser.parse_args()
    rows = [probe(log, args.batch_size, args.pool_factor, args.cap, args.max_staleness) for log in args.logs]
    print(f"{len(rows)} logs; mean ± std over logs\n")
    print("| rule | mean disagreement of selected turns | selected turns with disagreement < 0 | response tokens |")
    print("|---|---:|---:|---:|")
    for method in METHODS:
        cols = []
        for i, (scale, unit, digits) in enumerate(((1, "", 2), (100, "%", 1), (1, "", 2))):
            xs = [r[method][i] * scale for r in rows]
            sd = f" ± {statistics.stdev(xs):.{digits}f}" if len(xs) > 1 else ""
            cols.append(f"{statistics.fmean(xs):.{digits}f}{sd}{unit}")
        print(f"| {method} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
