"""What ``divopd tune-cap`` shows and writes: the per-k table (rich or Markdown; the recommended k marked ←) and the
figure over k of a :func:`divopd.analysis.tune_cap.tune_cap` result."""

from __future__ import annotations

import os
from typing import Any

from divopd.analysis.format import fmt, md_table, pyplot, rich_table, save_figure

__all__ = ["markdown_table", "plot_tune_cap", "render_table", "table_rows", "title"]

#: Column headers of the table, one row per k.
HEADER: tuple[str, ...] = ("k", "starved", "used / valid", "undecided", "unused", "eff. rollouts", "max share",
                           "distinct/batch (min)", "⌈B/k⌉ met", "staleness", "dead rows", "expired")


def _row(r: dict[str, Any], recommended: int | str | None) -> list[str]:
    mark = " ←" if r["cap"] == recommended else ""
    return [f"{r['cap']}{mark}", str(r["starved"]), f"{r['used_rollouts']} / {r['valid_rollouts']}",
            str(r["undecided_rollouts"]), fmt(r["unused_fraction"], pct=True), fmt(r["effective_rollouts_mean"]),
            fmt(r["max_rollout_share_mean"], pct=True),
            f"{fmt(r['distinct_rollouts_mean'])} ({fmt(r['distinct_rollouts_min'], 0)})",
            f"{fmt(r['cap_binds_fraction'], pct=True)} of {r['promised_rollouts']}", fmt(r["mean_staleness"], 2),
            fmt(r["dead_row_fraction"], pct=True), str(r["expired"])]


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the printed table (also used for Markdown)."""
    return list(HEADER), [_row(r, result["recommended"]) for r in result["caps"]]


def title(result: dict[str, Any]) -> str:
    cfg = result["config"]
    unit = "token-share cap" if cfg["cap_unit"] == "tokens" else "turn cap"
    return (f"tune-cap {cfg['method']} ({unit}): U={result['updates']} B={cfg['batch_size']} c={cfg['pool_factor']} "
            f"S={cfg['max_staleness']}, arrival/drain {result['arrival_drain_ratio']:.2f}")


def render_table(result: dict[str, Any]):  # -> rich.table.Table
    """A rich table, one row per k; the recommended k is marked ←."""
    return rich_table(*table_rows(result), title(result))


def markdown_table(result: dict[str, Any]) -> str:
    """The same table as Markdown."""
    header, rows = table_rows(result)
    return "\n".join(md_table(header, rows, align="l" + "r" * (len(header) - 1)))


def plot_tune_cap(result: dict[str, Any], path: str | os.PathLike) -> None:
    """Two panels over k: unused fraction and effective rollouts per batch; the recommended k is marked."""
    plt = pyplot()
    rows = result["caps"]
    labels = [str(r["cap"]) for r in rows]
    xs = list(range(len(rows)))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    for ax, key, label in ((axes[0], "unused_fraction", "unused fraction of valid rollouts"),
                           (axes[1], "effective_rollouts_mean", "effective rollouts per batch")):
        ys = [r[key] for r in rows]
        ax.plot(xs, [float("nan") if y is None else y for y in ys], "o-")
        if result["recommended"] is not None:
            i = labels.index(str(result["recommended"]))
            ax.axvline(i, color="tab:red", linestyle="--", linewidth=1, label=f"recommended k = {labels[i]}")
            ax.legend(fontsize=8)
        ax.set_xticks(xs, labels)
        ax.set_xlabel("cap k")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(title(result), fontsize=9)
    save_figure(fig, path)
