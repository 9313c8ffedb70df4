"""What ``divopd replay`` shows and writes: the per-method table, Table 14's selection chain, the per-update figure
and the JSON file of a :func:`divopd.analysis.replay.replay` result."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from divopd.analysis.format import dump_json, fmt, md_table, pyplot, rich_table, save_figure

__all__ = ["DIAGNOSTIC_COLUMNS", "chain_rows", "paper_sources", "plot_replay", "render_diagnostics",
           "render_selection_chain", "render_table", "write_json", "write_selection_chain"]

#: Headers of the printed table.
TABLE_HEADER: tuple[str, ...] = ("method", "updates", "starved", "valid", "used", "undecided", "unused",
                                 "eff. rollouts", "max share", "pool rollouts", "dead rows", "selected", "expired",
                                 "invalid")


def _row(name: str, m: dict[str, Any]) -> list[str]:
    return [name, str(m["updates"]), str(m["starved"]), str(m["valid_rollouts"]), str(m["used_rollouts"]),
            str(m["undecided_rollouts"]), fmt(m["unused_fraction"], pct=True), fmt(m["effective_rollouts_mean"], 2),
            fmt(m["max_rollout_share_mean"], pct=True), fmt(m["candidate_rollouts_mean"], 1),
            fmt(m["dead_row_fraction"], pct=True), str(m["selected"]), str(m["expired"]), str(m["invalid"])]


def render_table(result: dict[str, Any], title: str | None = None):  # -> rich.table.Table
    """A rich table of the per-method results."""
    cfg = result["config"]
    unit = " (token share)" if cfg.get("cap_unit") == "tokens" else ""
    title = title or (f"replay: U={result['updates']} B={cfg['batch_size']} c={cfg['pool_factor']} k={cfg['cap']}"
                      f"{unit} S={cfg['max_staleness']}, arrival/drain {result['arrival_drain_ratio']:.2f}")
    return rich_table(TABLE_HEADER, [_row(name, m) for name, m in result["methods"].items()], title)


#: The diagnostics table: (header, result key, digits or "pct", the paper's table or figure that reports it).
DIAGNOSTIC_COLUMNS: tuple[tuple[str, str, int | str, str], ...] = (
    ("effective rollouts", "effective_rollouts_mean", 2, "Table 9"),
    ("top-1 rollout share", "max_rollout_share_mean", "pct", "Table 9"),
    ("turns per rollout", "turns_per_rollout_mean", 2, "Table 9"),
    ("KL per token", "kl_per_token_mean", 3, "Table 9"),
    ("never selected", "never_selected_share", "pct", "Table 11"),
    ("selection Gini", "selection_gini", 3, "Table 11"),
    ("mean age", "mean_age", 2, "Table 12"),
    ("teacher tokens per trained token", "teacher_tokens_per_trained_token", 2, "Table 16"),
    ("scored but never selected", "never_selected_scored_share", "pct", "Table 16"),
    ("disagreement std EMA", "disagreement_std_ema", 3, "Figure 6"),
)


def paper_sources() -> str:
    """The footnote of the diagnostics table: which paper table or figure reports each column."""
    by_source: dict[str, list[str]] = {}
    for header, _, _, source in DIAGNOSTIC_COLUMNS:
        by_source.setdefault(source, []).append(header)
    return "In the paper: " + "; ".join(f"{source}: {', '.join(h)}" for source, h in by_source.items()) + "."


def render_diagnostics(result: dict[str, Any], title: str | None = None):  # -> rich.table.Table
    """A rich table of the diagnostics per method, with :func:`paper_sources` as its footnote."""
    header = ["method", *(h for h, *_ in DIAGNOSTIC_COLUMNS)]
    rows = [[name, *(fmt(m.get(key), pct=True) if digits == "pct" else fmt(m.get(key), int(digits))
                     for _, key, digits, _ in DIAGNOSTIC_COLUMNS)] for name, m in result["methods"].items()]
    return rich_table(header, rows, title or "diagnostics per method", caption=paper_sources(),
                      caption_justify="left")


def chain_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Table 14 as (header, rows): one row per turn-depth bucket × rollout outcome; per rule the share of its
    selected turns in the cell, and the share of the delivered turns (what every rule chose from)."""
    methods = result["methods"]
    delivered = result.get("delivered_chain", {})
    outcomes: list[str] = []
    for chain in [delivered, *(m["selection_chain"] for m in methods.values())]:
        for row in chain.values():
            outcomes += [o for o in row if o not in outcomes]
    header = ["depth", "outcome", *methods, "delivered"]
    rows = []
    for bucket in delivered or next(iter(methods.values()))["selection_chain"]:
        for o in outcomes:
            rows.append([bucket, o, *(fmt(m["selection_chain"].get(bucket, {}).get(o), pct=True)
                                      for m in methods.values()),
                         fmt(delivered.get(bucket, {}).get(o), pct=True)])
    return header, rows


def render_selection_chain(result: dict[str, Any], title: str | None = None):  # -> rich.table.Table
    """Table 14: where each rule's selected turns come from (shares of its selected turns per cell)."""
    header, rows = chain_rows(result)
    return rich_table(header, rows, title or "selection chain (Table 14): share of selected turns by turn depth × "
                      "outcome", align="ll" + "r" * (len(header) - 2))


def write_selection_chain(result: dict[str, Any], path: str | os.PathLike) -> None:
    """Table 14 as a Markdown table at ``path`` (creating the folder)."""
    header, rows = chain_rows(result)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["Share of each rule's selected turns by turn depth (turn index) × rollout outcome; delivered = share of "
             "the delivered turns.", "", *md_table(header, rows), ""]
    path.write_text("\n".join(lines), encoding="utf-8")


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
