"""What ``divopd replay`` shows and writes: the per-method table, the per-update figure and the JSON file of a
:func:`divopd.analysis.replay.replay` result."""

from __future__ import annotations

import os
from typing import Any

from divopd.analysis.format import dump_json, fmt, pyplot, save_figure

__all__ = ["plot_replay", "render_table", "write_json"]

#: Columns of the printed table: (header, justify).
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("method", "left"),
    ("updates", "right"),
    ("starved", "right"),
    ("valid", "right"),
    ("used", "right"),
    ("undecided", "right"),
    ("unused", "right"),
    ("eff. rollouts", "right"),
    ("max share", "right"),
    ("dead rows", "right"),
    ("selected", "right"),
    ("expired", "right"),
    ("invalid", "right"),
)


def _row(name: str, m: dict[str, Any]) -> list[str]:
    return [
        name,
        str(m["updates"]),
        str(m["starved"]),
        str(m["valid_rollouts"]),
        str(m["used_rollouts"]),
        str(m["undecided_rollouts"]),
        fmt(m["unused_fraction"], pct=True),
        fmt(m["effective_rollouts_mean"], 2),
        fmt(m["max_rollout_share_mean"], pct=True),
        fmt(m["dead_row_fraction"], pct=True),
        str(m["selected"]),
        str(m["expired"]),
        str(m["invalid"]),
    ]


def render_table(result: dict[str, Any], title: str | None = None):  # -> rich.table.Table
    """A rich table of the per-method results."""
    from rich.table import Table

    cfg = result["config"]
    unit = " (token share)" if cfg.get("cap_unit") == "tokens" else ""
    table = Table(
        title=title
        or (
            f"replay: U={result['updates']} B={cfg['batch_size']} c={cfg['pool_factor']} k={cfg['cap']}{unit} "
            f"S={cfg['max_staleness']}, arrival/drain {result['arrival_drain_ratio']:.2f}"
        )
    )
    for h, justify in TABLE_COLUMNS:
        table.add_column(h, justify=justify)
    for name, m in result["methods"].items():
        table.add_row(*_row(name, m))
    return table


def plot_replay(result: dict[str, Any], path: str | os.PathLike, title: str | None = None) -> None:
    """Four panels over updates: effective rollouts per batch, largest rollout share, cumulative valid rollouts used
    (with all valid rollouts delivered, dashed), and turns waiting in each sampler."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    ticks = list(range(result["updates"]))
    panels = [
        (axes[0, 0], "effective_rollouts", "effective rollouts per batch"),
        (axes[0, 1], "max_rollout_share", "largest rollout's token share"),
        (axes[1, 0], "used_rollouts", "valid rollouts used (cumulative)"),
        (axes[1, 1], "waiting", "turns waiting (pending + queued)"),
    ]
    for ax, key, label in panels:
        for name, m in result["methods"].items():
            ys = [float("nan") if v is None else v for v in m["series"][key]]
            ax.plot(ticks, ys, label=name, linewidth=1.2)
        ax.set_xlabel("learner update")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1, 0].plot(ticks, result["series"]["valid_rollouts"], "k--", linewidth=1, label="valid delivered")
    axes[1, 0].legend(fontsize=8)
    fig.suptitle(title or f"replay of {result.get('log') or 'log'}", fontsize=11)
    save_figure(fig, path)


def write_json(result: dict[str, Any], path: str | os.PathLike) -> None:
    """``result`` as strict JSON (NaN/inf -> null), creating the folder."""
    dump_json(result, path, indent=1)
