"""Formatting shared by the analysis commands and the suite, so that they write numbers the same way: numbers in
tables, strict JSON files, Markdown tables and headless matplotlib figures."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from divopd.experience.metrics import json_safe

__all__ = ["MISSING", "divide", "dump_json", "fmt", "json_safe", "md_table", "mean", "pyplot", "rich_table",
           "save_figure"]

#: What a table shows for a missing number.
MISSING = "–"


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the values that are not ``None``; ``None`` when there are none."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def divide(total: float, n: float) -> float | None:
    """``total / n``; ``None`` when ``n`` is 0 (a mean over nothing)."""
    return total / n if n else None


def fmt(value: float | None, digits: int = 1, *, pct: bool = False) -> str:
    """``value`` with ``digits`` decimals, or with ``pct`` as a percentage (``0.253`` -> ``25.3%``); :data:`MISSING`
    for ``None`` or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return f"{100 * value:.{digits}f}%" if pct else f"{value:.{digits}f}"


def dump_json(obj: Any, path: str | os.PathLike, *, indent: int = 1,
              nonfinite: Literal["null", "str"] = "null") -> None:
    """Write ``obj`` as strict JSON (:func:`json_safe`) with a final newline, creating the folder."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(obj, nonfinite=nonfinite), indent=indent, allow_nan=False)
    Path(path).write_text(text + "\n", encoding="utf-8")


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str | None = None) -> list[str]:
    """The lines of a Markdown table. ``align``: one letter per column, ``l`` (``---``) or ``r`` (``---:``); default
    ``---`` everywhere."""
    align = align if align is not None else "l" * len(header)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"md_table: align {align!r} must give l or r for each of {len(header)} columns")
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def rich_table(header: Sequence[str], rows: Iterable[Sequence[str]], title: str, align: str | None = None,
               **table_kwargs: Any) -> Any:
    """A ``rich.table.Table``; ``align`` as :func:`md_table`'s, default: the first column left, the others right."""
    from rich.table import Table

    table = Table(title=title, **table_kwargs)
    for h, a in zip(header, align or "l" + "r" * (len(header) - 1), strict=True):
        table.add_column(h, justify="left" if a == "l" else "right")
    for row in rows:
        table.add_row(*row)
    return table


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: figures are written to files, no display is needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 110) -> None:
    """Write ``fig`` to ``path`` (creating the folder) and close it."""
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
