"""The one formatting module (divopd.analysis.format) the reports, replay, tune-cap and the suite share."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from divopd.analysis.format import MISSING, divide, dump_json, fmt, json_safe, md_table, mean, pyplot, save_figure


def test_numbers() -> None:
    assert mean([1.0, None, 2.0]) == 1.5 and mean([None]) is None and mean([]) is None
    assert divide(3.0, 2) == 1.5 and divide(3.0, 0) is None
    assert fmt(0.2534, pct=True) == "25.3%" and fmt(2.0, 2) == "2.00"
    assert fmt(None) == MISSING == fmt(math.nan)


def test_json_is_strict_and_plain() -> None:
    obj = {"a": math.inf, 1: [np.float32(0.5), np.int64(3), (math.nan,)], "b": np.arange(2)}
    assert json_safe(obj) == {"a": None, "1": [0.5, 3, [None]], "b": [0, 1]}
    assert json_safe(obj, nonfinite="str")["a"] == "inf"
    json.dumps(json_safe(obj), allow_nan=False)


def test_dump_json_writes_a_file(tmp_path) -> None:
    dump_json({"x": math.nan}, tmp_path / "sub" / "out.json")
    assert json.loads((tmp_path / "sub" / "out.json").read_text()) == {"x": None}


def test_markdown_tables() -> None:
    assert md_table(["m", "v"], [["a", "1"]], align="lr") == ["| m | v |", "|---|---:|", "| a | 1 |"]
    with pytest.raises(ValueError, match="align"):
        md_table(["m", "v"], [], align="l")


def test_figures_on_agg(tmp_path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    save_figure(fig, tmp_path / "f" / "x.png")
    assert (tmp_path / "f" / "x.png").read_bytes()[:4] == b"\x89PNG"
