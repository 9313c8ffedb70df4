"""Table 14 on shared buffers, over many logs: each log replayed under vanilla, vanilla-pool, divopd-base and divopd
(``divopd replay --selection-chain`` on one log), shares of selected turns by turn depth × rollout outcome, mean over
the logs. Prints a markdown table.

    .venv/bin/python study/regime/selection_chain.py runs/regime/coin4/vanilla/seed*/experience \\
        --batch-size 32 --pool-factor 4 --cap 4 --max-staleness 2
"""

from __future__ import annotations

import argparse
import statistics

from divopd.analysis.replay import CHAIN_METHODS, ReplayConfig, replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--pool-factor", type=float, default=4)
    ap.add_argument("--cap", type=int, default=4)
    ap.add_argument("--max-staleness", type=int, default=2)
    args = ap.parse_args()
    config = ReplayConfig(methods=list(CHAIN_METHODS), batch_size=args.batch_size, pool_factor=args.pool_factor,
                          cap=args.cap, max_staleness=args.max_staleness)
    chains: dict[str, list[dict]] = {m: [] for m in (*CHAIN_METHODS, "delivered")}
    for log in args.logs:
        result = replay(log, config)
        for m in CHAIN_METHODS:
            chains[m].append(result["methods"][m]["selection_chain"])
        chains["delivered"].append(result["delivered_chain"])
    first = chains["delivered"][0]
    print(f"Shares of selected turns, mean over {len(args.logs)} logs (B = {args.batch_size}, c = {args.pool_factor}, "
          f"k = {args.cap}, δ = {args.max_staleness}).\n")
    print("| depth | outcome | " + " | ".join(chains) + " |")
    print("|---|---|" + "---|" * len(chains))
    for bucket, outcomes in first.items():
        for outcome in outcomes:
            cells = []
            for m in chains:
                values = [c[bucket][outcome] for c in chains[m] if c[bucket].get(outcome) is not None]
                cells.append(f"{100 * statistics.fmean(values):.1f}%" if values else "–")
            print(f"| {bucket} | {outcome} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
