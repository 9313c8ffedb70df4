"""Loading run directories for ``divopd report``: ``config.yaml`` (method, setting, seed), ``metrics.jsonl`` (eval
and update records, checked line by line) and ``summary.json`` (the run finished)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from divopd.errors import UsageError, describe_yaml_error
from divopd.experience.metrics import EvalPoint

__all__ = ["ReportError", "Run", "find_run_dirs", "load_run", "read_metrics"]


class ReportError(UsageError):
    """A run directory or metrics file that cannot be read; the message names the file (and line)."""


@dataclass
class Run:
    """One run directory: identity from config.yaml, eval points (SR in percent) and update records."""

    path: Path
    method: str
    setting: str
    seed: Any
    evals: list[EvalPoint] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def last_update(self) -> int | None:
        """Highest learner version seen in any record."""
        us = [e.update for e in self.evals] + [r["update"] for r in self.updates]
        return max(us) if us else None


def find_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories named on the command line: a dir holding ``config.yaml``, or every such dir below it."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"{p}: not a directory")
        if (p / "config.yaml").is_file():
            found.append(p)
            continue
        below = sorted(c.parent for c in p.rglob("config.yaml") if "checkpoints" not in c.relative_to(p).parts)
        if not below:
            raise ReportError(f"{p}: no config.yaml in it or below it (not a run directory)")
        found.extend(below)
    unique: dict[Path, Path] = {}  # each directory once, as first named
    for p in found:
        unique.setdefault(p.resolve(), p)
    return list(unique.values())


def _load_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.yaml"
    try:
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{cfg_path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ReportError(f"{cfg_path}: malformed YAML: {describe_yaml_error(exc)}") from exc
    if not isinstance(cfg, dict):
        raise ReportError(f"{cfg_path}: expected a mapping at top level, got {type(cfg).__name__}")
    for key in ("method", "setting", "seed"):
        if cfg.get(key) is None:
            raise ReportError(f"{cfg_path}: missing top-level key {key!r} (needed to group runs)")
    return cfg


def _number(rec: dict[str, Any], key: str, where: str) -> float | None:
    value = rec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Records of a ``metrics.jsonl`` and notes. A malformed line raises :class:`ReportError` naming file and line,
    except a cut-off final line without newline (a write in progress), which is skipped with a note."""
    notes: list[str] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    lines = text.split("\n")
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):  # last line, no newline after it: being written right now
                notes.append(f"{where}: skipped a cut-off final line (run in progress?)")
                continue
            raise ReportError(f"{where}: malformed JSON line: {exc.msg} at column {exc.colno}") from exc
        if not isinstance(rec, dict):
            raise ReportError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        kind = rec.get("kind")
        if kind not in ("update", "eval"):
            raise ReportError(f"{where}: 'kind' must be 'update' or 'eval', got {kind!r}")
        update = rec.get("update")
        if isinstance(update, bool) or not isinstance(update, int) or update < 0:
            raise ReportError(f"{where}: 'update' must be a non-negative integer, got {update!r}")
        if kind == "eval":
            sr = _number(rec, "eval/success_rate", where)
            if sr is None:
                raise ReportError(f"{where}: eval record without 'eval/success_rate'")
            if not 0.0 <= sr <= 1.0:
                raise ReportError(f"{where}: 'eval/success_rate' must be in [0, 1], got {sr}")
        for key in ("learner/tokens_total", "learner/compute_s_total"):
            _number(rec, key, where)
        rec["_line"] = lineno
        records.append(rec)
    return records, notes


def load_run(path: str | Path) -> Run:
    """Load one run directory (config.yaml + metrics.jsonl); SR converted to percent, evals sorted by update."""
    path = Path(path)
    cfg = _load_config(path)
    run_ = Run(path=path, method=str(cfg["method"]), setting=str(cfg["setting"]), seed=cfg["seed"], config=cfg)
    run_.finished = (path / "summary.json").is_file()
    mpath = path / "metrics.jsonl"
    if not mpath.is_file():
        run_.notes.append(f"{path}: no metrics.jsonl yet")
        return run_
    records, notes = read_metrics(mpath)
    run_.notes.extend(notes)
    run_.updates = sorted((r for r in records if r["kind"] == "update"), key=lambda r: r["update"])
    # Cumulative resources at an eval: from the eval record, else from the latest update record at or before it.
    cum: dict[str, list[tuple[int, float]]] = {"learner/tokens_total": [], "learner/compute_s_total": []}
    for r in run_.updates:
        for key, series in cum.items():
            if r.get(key) is not None:
                series.append((r["update"], float(r[key])))

    def at(key: str, update: int) -> float | None:
        return next((v for u, v in reversed(cum[key]) if u <= update), None)  # the series ascend by update

    by_update: dict[int, EvalPoint] = {}
    for r in (r for r in records if r["kind"] == "eval"):
        u = r["update"]
        if u in by_update:
            run_.notes.append(f"{mpath}:{r['_line']}: second eval at update {u}; the later line is used")
        tokens = r.get("learner/tokens_total")
        compute = r.get("learner/compute_s_total")
        by_update[u] = EvalPoint(update=u, sr=100.0 * float(r["eval/success_rate"]),
                                 tokens=float(tokens) if tokens is not None else at("learner/tokens_total", u),
                                 compute_s=float(compute) if compute is not None else at("learner/compute_s_total", u))
    run_.evals = [by_update[u] for u in sorted(by_update)]
    if not run_.evals:
        run_.notes.append(f"{path}: no evaluation yet")
    return run_
