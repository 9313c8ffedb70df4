"""The figures of ``divopd report``, per setting: SR against learner updates, tokens and compute seconds, the
batch-composition curves and the per-update diagnostics of the paper's tables (docs/guides/report.md lists them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from divopd.analysis.format import pyplot, save_figure
from divopd.analysis.report.compute import COMPOSITION, COMPOSITION_LABELS, DIAGNOSTICS
from divopd.analysis.report.load import Run

__all__ = ["plot_setting"]

#: The SR figures: (EvalPoint attribute on the x axis, axis label, file-name stem).
SR_AXES = (
    ("update", "learner updates", "sr_vs_updates"),
    ("tokens", "learner tokens", "sr_vs_tokens"),
    ("compute_s", "learner compute seconds", "sr_vs_compute"),
)


def _curve(run_: Run, x: str) -> tuple[list[float], list[float]]:
    pts = [(getattr(e, x), e.sr) for e in run_.evals if getattr(e, x) is not None]
    return [float(p[0]) for p in pts], [p[1] for p in pts]


def _draw_method(ax: Any, curves: list[tuple[list[float], list[float]]], method: str, color: str) -> None:
    """One method's SR curve: the single seed, or the mean over seeds with a min–max band on their common x range."""
    import numpy as np

    if len(curves) == 1:
        ax.plot(curves[0][0], curves[0][1], marker=".", color=color, label=method)
        return
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    if hi <= lo:  # seeds share no x range: draw them separately
        for i, c in enumerate(curves):
            ax.plot(c[0], c[1], alpha=0.6, color=color, label=method if i == 0 else None)
        return
    grid = np.linspace(lo, hi, 200)
    ys = np.array([np.interp(grid, c[0], c[1]) for c in curves])
    ax.plot(grid, ys.mean(axis=0), color=color, label=f"{method} (n={len(curves)})")
    ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=color, alpha=0.2)


def _sr_figure(setting: str, runs_by_method: dict[str, list[Run]], tau: float | None, x: str, label: str,
               color: dict[str, str], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for method, rs in runs_by_method.items():
        curves = [c for c in (_curve(r, x) for r in rs) if c[0]]
        if curves:
            drawn = True
            _draw_method(ax, curves, method, color[method])
    if tau is not None:
        ax.axhline(tau, color="grey", linestyle="--", linewidth=1, label=f"τ = {tau:g}%")
    ax.set_xlabel(label)
    ax.set_ylabel("success rate (%)")
    ax.set_title(f"{setting}: SR vs {label}")
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no evaluation recorded", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    save_figure(fig, path)


def _curves_figure(setting: str, runs_by_method: dict[str, list[Run]], color: dict[str, str], path: Path,
                   panels: list[tuple[str, str]], title: str, smooth: bool = True) -> None:
    """One panel per (label, metrics key): the per-update mean over seeds of each method, lightly smoothed."""
    import numpy as np

    plt = pyplot()
    cols = 3
    nrows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(12, 3.25 * nrows), squeeze=False)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for ax, (label, key) in zip(axes.flat, panels, strict=False):
        for method, rs in runs_by_method.items():
            per_update: dict[int, list[float]] = {}
            for r in rs:
                for rec in r.updates:
                    if isinstance(rec.get(key), (int, float)):
                        per_update.setdefault(rec["update"], []).append(float(rec[key]))
            if not per_update:
                continue
            us = sorted(per_update)
            ys = np.array([sum(per_update[u]) / len(per_update[u]) for u in us])
            w = max(1, len(ys) // 30) if smooth else 1
            if w > 1:
                ys = np.convolve(ys, np.ones(w) / w, mode="valid")
                us = us[w - 1 :]
            ax.plot(us, ys, color=color[method], label=method)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("learner update", fontsize=8)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"{key}\nnot recorded", ha="center", va="center", fontsize=8, transform=ax.transAxes)
    fig.suptitle(f"{setting}: {title}")
    fig.tight_layout()
    save_figure(fig, path)


#: The per-update curves of the diagnostics figure: the paper-table keys not already drawn in the composition figure.
DIAGNOSTIC_PANELS = [(f"{label} ({where})", key) for _, key, _, label, where in DIAGNOSTICS
                     if key not in {k for _, k, _ in COMPOSITION}]


def plot_setting(setting: str, runs_by_method: dict[str, list[Run]], tau: float | None, out: Path) -> list[str]:
    """Write the PNGs of one setting; returns their file names (relative to ``out``)."""
    written = []
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", setting).strip("_") or "setting"  # a file-name stem
    color = {m: f"C{i % 10}" for i, m in enumerate(runs_by_method)}  # one colour per method in every figure
    for x, label, stem in SR_AXES:
        written.append(f"{slug}_{stem}.png")
        _sr_figure(setting, runs_by_method, tau, x, label, color, out / written[-1])
    composition = [(COMPOSITION_LABELS[n], k) for n, k, how in COMPOSITION if how == "mean"]
    for stem, panels, title, smooth in (("composition", composition, "batch composition", True),
                                        # unsmoothed: the EMA of Figure 6 is its own smoothing
                                        ("diagnostics", DIAGNOSTIC_PANELS, "diagnostics of the paper's tables", False)):
        written.append(f"{slug}_{stem}.png")
        _curves_figure(setting, runs_by_method, color, out / written[-1], panels, title, smooth)
    return written
