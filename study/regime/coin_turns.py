"""Where a *coin* student's mistakes sit and which rule trains on them, per method of one study group: each run's
experience log is replayed under the run's own sampler (its config.yaml: rule, settings and seed; the learner's batches,
re-drawn by the same sampler on the same arrivals), and the turns are split by whether the coin is in view
(``take coin`` among the prompt's valid actions). Prints, mean over the seeds: the share of delivered and of trained
turns with the coin in view, and the share of those where the student did not take it. Prints a markdown table.

    .venv/bin/python study/regime/coin_turns.py runs/regime-coin6-dart/coin6-dart \\
        --tokenizer cache/coin6-dart/student
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from actions import valid_actions

from divopd.analysis.replay_rules import deliveries, log_updates
from divopd.experience.log import read_log
from divopd.models import ModelLoadError, load_tokenizer
from divopd.sampling import SamplerConfig, make_sampler
from divopd.train.config import load_config


def coin_shares(log: Path, config: SamplerConfig, tokenizer) -> tuple[float, float, float, float]:
    """(delivered turns with the coin in view, trained turns with it, delivered coin turns the student did not take
    it on, trained ones), as fractions, for one log replayed under the sampler ``config``."""
    sampler = make_sampler(config)
    seen: dict[tuple[str, int], tuple[bool, bool]] = {}  # (coin in view, student took it)

    def classify(turn) -> tuple[bool, bool]:
        key = (turn.rollout_id, turn.turn_index)
        if key not in seen:
            view = "take coin" in valid_actions(tokenizer.decode(list(turn.prompt_ids)))
            took = tokenizer.decode(list(turn.response_ids)).replace("<eos>", "").strip() == "take coin"
            seen[key] = (view, took)
        return seen[key]

    delivered, trained = [], []
    for j, arrivals in deliveries(read_log(log), log_updates(log)):
        turns = [a.turn for a in arrivals]
        delivered += [classify(t) for t in turns]
        sampler.add(turns)
        batch = sampler.next_batch(j)
        if batch is not None:
            trained += [classify(t) for t in batch.payloads]

    def shares(rows: list[tuple[bool, bool]]) -> tuple[float, float]:
        coin = [took for view, took in rows if view]
        return len(coin) / max(1, len(rows)), sum(not took for took in coin) / max(1, len(coin))

    (d_view, d_miss), (t_view, t_miss) = shares(delivered), shares(trained)
    return d_view, t_view, d_miss, t_miss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("group", type=Path, help="a study group folder: <method>/seed<N>/experience inside")
    ap.add_argument("--tokenizer", required=True, help="the student's HF folder (its tokenizer decodes the logs)")
    args = ap.parse_args()
    if not args.group.is_dir():
        print(f"coin_turns: {args.group}: not a study group folder (<method>/seed<N>/experience inside)",
              file=sys.stderr)
        sys.exit(2)
    try:
        tokenizer = load_tokenizer(args.tokenizer)
    except ModelLoadError as exc:
        print(f"coin_turns: --tokenizer {exc}", file=sys.stderr)
        sys.exit(2)
    print("| method | seeds | delivered turns, coin in view | trained turns, coin in view | coin turns not taken, "
          "delivered | coin turns not taken, trained |")
    print("|---|---|---|---|---|---|")
    for method_dir in sorted(p for p in args.group.iterdir() if p.is_dir()):
        method = method_dir.name
        rows = []
        for log in sorted(method_dir.glob("seed*/experience")):
            if not (log.parent / "summary.json").is_file():  # a run still going
                continue
            rows.append(coin_shares(log, load_config(log.parent / "config.yaml").sampler_config(), tokenizer))
        if rows:
            cells = " | ".join(f"{100 * statistics.mean(col):.1f}%" for col in zip(*rows, strict=True))
            print(f"| {method} | {len(rows)} | {cells} |")


if __name__ == "__main__":
    main()
