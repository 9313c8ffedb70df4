"""``divopd report RUN_DIR...``: compare runs of several methods per setting, in the layout of the paper's Section 4
(grouping, files and rules: docs/guides/report.md)."""

from __future__ import annotations

from divopd.analysis.report.compute import (
    COMPOSITION,
    COMPOSITION_LABELS,
    DIAGNOSTICS,
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

__all__ = ["COMPOSITION", "COMPOSITION_LABELS", "DIAGNOSTICS", "ReportError", "Run", "build_report", "composition",
           "diagnostics", "find_run_dirs", "load_run", "natural_key", "plot_setting", "read_metrics", "render_markdown",
           "seed_metrics", "write_report"]
