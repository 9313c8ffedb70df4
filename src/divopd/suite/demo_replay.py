"""``python -m divopd.suite.demo_replay`` (part of ``make demo``): ``divopd simulate`` per preset, ``divopd replay`` of
the selection rules over each log, and a table and plots under ``runs/demo-replay/``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from divopd.analysis.format import fmt, md_table, pyplot, rich_table, save_figure
from divopd.analysis.replay import ReplayConfig, plot_replay, replay, write_json
from divopd.analysis.simulate import PRESETS, simulate
from divopd.sampling.method_rows import method_names

__all__ = ["DEMO_METHODS", "run_replay_demo", "summary_rows", "markdown_table", "main"]

DEMO_METHODS: tuple[str, ...] = method_names("demo-replay")


def summary_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (preset, method) with the coverage and concentration numbers."""
    rows = []
    for preset, r in results.items():
        for method, m in r["methods"].items():
            rows.append({"preset": preset, "load": r["arrival_drain_ratio"], "method": method,
                         "valid": m["valid_rollouts"], "used": m["used_rollouts"], "undecided": m["undecided_rollouts"],
                         "unused": m["unused_fraction"], "eff": m["effective_rollouts_mean"],
                         "max_share": m["max_rollout_share_mean"], "dead": m["dead_row_fraction"],
                         "expired": m["expired"], "invalid": m["invalid"]})
    return rows


#: Columns of the summary table: (header, alignment, cell of a summary row).
TABLE: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("preset", "l", lambda r: r["preset"]),
    ("arrival/drain", "r", lambda r: fmt(r["load"], 2)),
    ("method", "l", lambda r: r["method"]),
    ("valid rollouts", "r", lambda r: str(r["valid"])),
    ("used", "r", lambda r: str(r["used"])),
    ("undecided", "r", lambda r: str(r["undecided"])),
    ("unused", "r", lambda r: fmt(r["unused"], pct=True)),
    ("eff. rollouts/batch", "r", lambda r: fmt(r["eff"])),
    ("max rollout share", "r", lambda r: fmt(r["max_share"], pct=True)),
    ("dead rows", "r", lambda r: fmt(r["dead"], pct=True)),
    ("expired", "r", lambda r: str(r["expired"])),
    ("invalid", "r", lambda r: str(r["invalid"])),
)
#: The columns of the printed (rich) table, by header.
PRINTED = ("preset", "arrival/drain", "method", "valid rollouts", "used", "unused", "eff. rollouts/batch",
           "max rollout share", "dead rows")
#: Their shorter headers in the printed table.
_SHORT = {"arrival/drain": "load", "valid rollouts": "valid", "eff. rollouts/batch": "eff. rollouts",
          "max rollout share": "max share"}


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table (what docs/guides/replay.md shows)."""
    lines = md_table([h for h, _, _ in TABLE], ([cell(r) for _, _, cell in TABLE] for r in rows),
                     align="".join(a for _, a, _ in TABLE))
    return "\n".join(lines) + "\n"


def plot_summary(rows: list[dict[str, Any]], path: str | os.PathLike) -> None:
    """Grouped bars per preset: unused fraction of valid rollouts, and effective rollouts per batch."""
    import numpy as np

    plt = pyplot()
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    value = {(r["preset"], r["method"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    x = np.arange(len(presets))
    width = 0.8 / len(methods)
    for ax, key, label, scale in (
        (axes[0], "unused", "valid rollouts never used (%)", 100),
        (axes[1], "eff", "effective rollouts per batch", 1),
    ):
        for i, method in enumerate(methods):
            ys = [scale * (value[(p, method)][key] or 0) for p in presets]
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, ys, width, label=method)
        ax.set_xticks(x, [f"{p}\n(load {value[(p, methods[0])]['load']:.2f})" for p in presets])
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("shared-buffer replay of simulated asynchronous producers (B=256, c=4, k=4, S=2, 100 updates)")
    save_figure(fig, path)


def run_replay_demo(out_dir: str | os.PathLike = "runs/demo-replay", presets: tuple[str, ...] = tuple(PRESETS),
                    updates: int = 100, seed: int = 0, batch_size: int = 256,
                    methods: tuple[str, ...] = DEMO_METHODS) -> dict[str, dict[str, Any]]:
    """Simulate each preset at its default load (≈ 2), replay ``methods`` over each log, write everything to
    ``out_dir`` (``<preset>.parquet/.json/.png``, ``table.md``, ``summary.png``) and return the replay results."""
    from rich.console import Console

    console = Console(width=None if Console().is_terminal else 160)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in presets:
        t0 = time.perf_counter()
        log = out / f"{name}.parquet"
        s = simulate(name, log, updates=updates, seed=seed, batch_size=batch_size, overwrite=True)
        cfg = ReplayConfig(methods=methods, batch_size=batch_size, updates=updates, seed=seed)
        result = replay(log, cfg)
        write_json(result, out / f"{name}.json")
        plot_replay(result, out / f"{name}.png", title=f"{name}-like preset, arrival/drain {s.arrival_drain_ratio:.2f}")
        results[name] = result
        console.print(f"{name}: {s.turns} turns, {s.rollouts} rollouts, truncated prompts "
                      f"{100 * s.truncated_turns / max(s.turns, 1):.1f}%, arrival/drain {s.arrival_drain_ratio:.2f} "
                      f"({time.perf_counter() - t0:.1f}s)")
    rows = summary_rows(results)
    table = markdown_table(rows)
    (out / "table.md").write_text(table)
    plot_summary(rows, out / "summary.png")

    columns = [(_SHORT.get(h, h), align, cell) for h, align, cell in TABLE if h in PRINTED]
    console.print(rich_table([h for h, _, _ in columns], ([cell(r) for _, _, cell in columns] for r in rows),
                             f"shared-buffer replay, B={batch_size}, c=4, k=4, S=2, {updates} updates",
                             align="".join(a for _, a, _ in columns)))
    console.print(f"wrote {out}/table.md, {out}/summary.png and per-preset .parquet/.json/.png")
    return results


def main(argv: list[str] | None = None) -> int:
    out_dir = (argv if argv is not None else sys.argv[1:]) or ["runs/demo-replay"]
    run_replay_demo(out_dir[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
