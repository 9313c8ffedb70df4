"""``divopd report RUN_DIR...``: compare runs of several methods per setting, in the layout of the paper's Section 4.

For each setting (``config.yaml: setting``) and method (``config.yaml: method``), seeds (``config.yaml: seed``) are
aggregated. Written to ``--out`` (default ``./report``):

- ``report.md``: Table 1-like table per setting (peak SR, final-five SR, nAUC over a common update budget U, learner
  tokens and learner compute seconds to the target τ as baseline/method ratios, a dash when not reached), geometric-mean
  speedups across settings, a batch-composition table (effective rollouts, max rollout share, dead rows, expired turns,
  staleness, disagreement std across rollouts — Figure 6 — and the arrival/drain ratio of Table 2), the diagnostics of
  the paper's tables (Tables 9, 12, 16 and Figure 6's EMA: ``compute.DIAGNOSTICS``), and per-seed rows.
- ``report.json``: the same numbers, machine-readable.
- PNGs per setting: SR vs learner updates, vs learner tokens, vs learner compute seconds (mean over seeds, band =
  min–max over seeds), batch-composition curves, and the per-update diagnostics (Figure 6's EMA among them).

Rules (see docs/guides/report.md): SR in percent; τ defaults to the largest multiple of 5 at or below the baseline's
peak SR (mean of its seeds' peaks); U defaults to the smallest last-eval update among the setting's finished runs; a
cost to τ is the mean over the seeds that reached τ, and the ratio is baseline mean / method mean; ± is the std across
seeds (sample, ddof=1) when there are two or more seeds, else the std across the final five checkpoints as in the paper.

The package follows the report's jobs: :mod:`~divopd.analysis.report.load` (run directories, ``metrics.jsonl``,
``summary.json``), :mod:`~divopd.analysis.report.compute` (SR statistics, time to target, nAUC, aggregates),
:mod:`~divopd.analysis.report.render` (Markdown and JSON) and :mod:`~divopd.analysis.report.plot` (figures). The
command's flags and entry point are in :mod:`divopd.commands.report`.
"""

from __future__ import annotations

from divopd.analysis.report.compute import (
    COMPOSITION,
    COMPOSITION_LABELS,
    DIAGNOSTICS,
    METHOD_ORDER,
    build_report,
    composition,
    diagnostics,
    natural_key,
    seed_metrics,
)
from divopd.analysis.report.compute import (
    _method_key as _method_key,  # the method order; tests use it
)
from divopd.analysis.report.load import ReportError, Run, find_run_dirs, load_run, read_metrics
from divopd.analysis.report.plot import plot_setting
from divopd.analysis.report.render import render_markdown, write_report

__all__ = [
    "COMPOSITION",
    "COMPOSITION_LABELS",
    "DIAGNOSTICS",
    "METHOD_ORDER",
    "ReportError",
    "Run",
    "build_report",
    "composition",
    "diagnostics",
    "find_run_dirs",
    "load_run",
    "natural_key",
    "plot_setting",
    "read_metrics",
    "render_markdown",
    "seed_metrics",
    "write_report",
]
