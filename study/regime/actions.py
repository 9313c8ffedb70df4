"""What the student does late in a run, per method of one study group: over the turns that arrived in the last
``--last`` updates, the share of invalid actions (not among the prompt's "Valid actions"), of the most common invalid
action, and of the turns that come right after an invalid action, mean over the seeds. Prints a markdown table.

    .venv/bin/python study/regime/actions.py runs/regime-coin4-tail/coin4-tail --tokenizer cache/coin4/student
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from divopd.experience.log.parts import log_files
from divopd.models import load_tokenizer


def valid_actions(prompt: str) -> set[str]:
    """The actions the prompt's last "Valid actions:" line lists."""
    line = prompt.rsplit("Valid actions:", 1)[-1].split("\n", 1)[0].split("<", 1)[0]
    return {a.strip() for a in line.split(",") if a.strip()}


def run_shares(log: Path, tokenizer, last: int) -> tuple[float, str, float, float]:
    """(invalid share, most common invalid action, its share of all turns, share of turns after an invalid one)."""
    rows = [r for f in log_files(log) for r in pq.read_table(
        f, columns=["rollout_id", "arrival_update", "prompt_ids", "response_ids", "turn_index"]).to_pylist()]
    end = max(r["arrival_update"] for r in rows)
    rows = [r for r in rows if r["arrival_update"] > end - last]
    invalid: Counter[str] = Counter()
    bad: set[tuple[str, int]] = set()
    for r in rows:
        action = tokenizer.decode(r["response_ids"]).replace("<eos>", "").strip()
        if action not in valid_actions(tokenizer.decode(r["prompt_ids"])):
            invalid[action] += 1
            bad.add((r["rollout_id"], r["turn_index"]))
    after_invalid = sum((r["rollout_id"], r["turn_index"] - 1) in bad for r in rows)
    n = max(len(rows), 1)
    top, top_n = (invalid.most_common(1) or [("-", 0)])[0]
    return sum(invalid.values()) / n, top, top_n / n, after_invalid / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("group", type=Path, help="a study group folder: <method>/seed<N>/experience inside")
    ap.add_argument("--tokenizer", required=True, help="the student's tokenizer folder")
    ap.add_argument("--last", type=int, default=20, help="updates at the end of each run to read (default 20)")
    args = ap.parse_args()
    tokenizer = load_tokenizer(args.tokenizer)
    print("| method | seeds | invalid actions | most common invalid action (share of turns) "
          "| turns after an invalid one |")
    print("|---|---|---|---|---|")
    for method in sorted(p.name for p in args.group.iterdir() if p.is_dir()):
        shares = [run_shares(log, tokenizer, args.last)
                  for log in sorted((args.group / method).glob("seed*/experience"))]
        if not shares:
            continue
        tops = Counter(s[1] for s in shares).most_common(1)[0][0]
        print(f"| {method} | {len(shares)} | {100 * statistics.mean(s[0] for s in shares):.0f}% | {tops} "
              f"({100 * statistics.mean(s[2] for s in shares if s[1] == tops):.0f}%) | "
              f"{100 * statistics.mean(s[3] for s in shares):.0f}% |")


if __name__ == "__main__":
    main()
