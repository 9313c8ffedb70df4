"""Evaluation metrics of the paper (Section 4) as pure functions, one rule per function, and the run's metrics writer.
SR values are in the caller's unit (only :func:`default_target` assumes percent); standard deviations are population
std (the final five are the whole population described)."""

from __future__ import annotations

import json
import math
import os
import threading
import time as _time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["SR_TOLERANCE", "Cost", "EvalPoint", "MetricsWriter", "cost_to_target", "default_target", "final_five",
           "geometric_mean", "json_safe", "nauc", "peak_sr", "reaches", "speedup"]

#: Absolute tolerance when comparing an SR with a target: 0.29 * 100 == 28.999999999999996 must reach τ = 29.
SR_TOLERANCE = 1e-9


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation checkpoint: learner version, SR, and the cumulative learner-side resources at that point."""

    update: int
    sr: float
    tokens: float | None = None  # learner/tokens_total at this eval
    compute_s: float | None = None  # learner/compute_s_total at this eval


@dataclass(frozen=True)
class Cost:
    """Learner-side resources accumulated through the first evaluation reaching τ."""

    update: int
    tokens: float | None
    compute_s: float | None


def peak_sr(srs: Sequence[float]) -> float | None:
    """Peak SR: the highest SR over all evaluation checkpoints (``None`` when there is none)."""
    return max(srs) if len(srs) else None


def final_five(srs: Sequence[float], n: int = 5) -> tuple[float, float] | None:
    """Final-five SR: (mean, population std) over the last ``n`` evaluations (fewer if fewer; ``None`` for none)."""
    if n < 1:
        raise ValueError(f"final_five: n must be >= 1, got {n}")
    last = [float(x) for x in srs[-n:]]
    if not last:
        return None
    mean = sum(last) / len(last)
    std = math.sqrt(sum((x - mean) ** 2 for x in last) / len(last))
    return mean, std


def nauc(updates: Sequence[float], srs: Sequence[float], budget: float, rule: str = "trapezoid") -> float | None:
    """nAUC: area under the SR-vs-update curve over ``[updates[0], budget]`` divided by the span (= mean SR there).

    ``trapezoid`` joins consecutive evals linearly (the SR at ``budget`` interpolated), ``step`` holds each eval's SR
    until the next. ``None`` when no eval is at or after ``budget`` (a run in progress is never scored on a shorter
    span); the first eval's SR when it is at ``budget``. ``updates`` must be strictly increasing."""
    if rule not in ("trapezoid", "step"):
        raise ValueError(f"nauc: rule must be 'trapezoid' or 'step', got {rule!r}")
    if len(updates) != len(srs):
        raise ValueError(f"nauc: {len(updates)} updates but {len(srs)} SR values")
    if not len(updates):
        return None
    if any(updates[i + 1] <= updates[i] for i in range(len(updates) - 1)):
        raise ValueError("nauc: updates must be strictly increasing")
    start = updates[0]
    if budget < start:
        raise ValueError(f"nauc: budget {budget} is before the first eval (update {start})")
    if updates[-1] < budget:
        return None
    if budget == start:
        return float(srs[0])
    area = 0.0
    for i in range(len(updates) - 1):
        u0, s0, u1, s1 = updates[i], srs[i], updates[i + 1], srs[i + 1]
        if u0 >= budget:
            break
        end = min(u1, budget)
        if rule == "step":
            area += s0 * (end - u0)
        else:
            s_end = s0 + (s1 - s0) * (end - u0) / (u1 - u0)
            area += 0.5 * (s0 + s_end) * (end - u0)
    return area / (budget - start)


def default_target(vanilla_peak_percent: float) -> float | None:
    """Default τ: the largest multiple of 5 (percent) at or below vanilla's peak SR; ``None`` below 5%."""
    tau = 5.0 * math.floor(vanilla_peak_percent / 5.0 + SR_TOLERANCE)
    return tau if tau >= 5.0 else None


def reaches(sr: float, tau: float) -> bool:
    """An evaluation reaches τ when its SR is at least τ (up to :data:`SR_TOLERANCE`)."""
    return sr >= tau - SR_TOLERANCE


def cost_to_target(evals: Sequence[EvalPoint], tau: float) -> Cost | None:
    """Learner tokens and compute seconds through the first evaluation reaching τ (``None``: none does, a dash)."""
    for e in evals:
        if reaches(e.sr, tau):
            return Cost(update=e.update, tokens=e.tokens, compute_s=e.compute_s)
    return None


def speedup(vanilla_cost: float | None, method_cost: float | None) -> float | None:
    """Time-to-target ratio ``C_vanilla(τ) / C_method(τ)`` (above one favours the method); ``None`` when a cost is
    missing; ``inf`` for a zero method cost (1.0 when vanilla's is zero too)."""
    if vanilla_cost is None or method_cost is None:
        return None
    if vanilla_cost < 0 or method_cost < 0:
        raise ValueError(f"speedup: negative cost (vanilla {vanilla_cost}, method {method_cost})")
    if method_cost == 0:
        return 1.0 if vanilla_cost == 0 else math.inf
    return vanilla_cost / method_cost


def geometric_mean(values: Sequence[float]) -> float | None:
    """Geometric mean (the paper's cross-setting speedup summary); ``None`` for no values, ``ValueError`` for a
    non-positive or non-finite one (callers drop dashes first)."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    bad = [v for v in vals if not (v > 0 and math.isfinite(v))]
    if bad:
        raise ValueError(f"geometric_mean: values must be positive and finite, got {bad}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def json_safe(obj: Any, *, nonfinite: Literal["null", "str", "keep"] = "null", strict: bool = False) -> Any:
    """A copy of ``obj`` that JSON can hold: dicts (keys as text) and lists (also from tuples and numpy arrays), numpy
    scalars as Python numbers, and non-finite floats as ``None`` (``nonfinite="null"``: strict JSON), as their text
    ``"inf"``, ``"-inf"``, ``"nan"`` (``"str"``) or as they are (``"keep"``). Anything else is returned as it is, or
    with ``strict`` raises ``TypeError``."""
    if isinstance(obj, float):
        if nonfinite == "keep" or math.isfinite(obj):
            return obj
        return None if nonfinite == "null" else str(float(obj))
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): json_safe(v, nonfinite=nonfinite, strict=strict)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, nonfinite=nonfinite, strict=strict) for v in obj]
    if obj is None or isinstance(obj, (str, int)):
        return obj
    tolist = getattr(obj, "tolist", None)  # numpy scalars and arrays
    if callable(tolist) and type(obj).__module__ == "numpy":
        return json_safe(tolist(), nonfinite=nonfinite, strict=strict)
    if strict:
        raise TypeError(f"cannot store a {type(obj).__name__} as JSON")
    return obj


def _jsonable(value: Any, key: str) -> Any:
    """A JSON-safe copy of a metric value: non-finite floats become ``null`` (strict JSON has no NaN)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return _jsonable(item(), key)
        except (ValueError, RuntimeError):
            pass
    raise TypeError(f"metric {key!r}: value of type {type(value).__name__} is not a JSON scalar")


class MetricsWriter:
    """Appends ``metrics.jsonl`` records (``{"kind", "update", "time", <metrics>}`` per line, flushed at once) to a
    run directory and mirrors numeric values to TensorBoard (``tb/``); thread-safe. ``time`` defaults to seconds since
    the writer was created plus ``time_offset`` (a resume: the previous elapsed time). On opening, a cut-off final
    line is dropped with a warning; with ``truncate_after=N`` (a resume from update N), so are records with
    ``update > N`` and lines that are not JSON."""

    KINDS = ("update", "eval")

    def __init__(self, run_dir: str | os.PathLike[str], *, tensorboard: bool = True, time_offset: float = 0.0,
                 truncate_after: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._lock = threading.Lock()
        self._t0 = _time.monotonic() - time_offset
        self._repair(truncate_after)
        self._file = open(self.path, "a", encoding="utf-8")  # closed in close()
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # TensorBoard is optional for the writer; metrics.jsonl is the record
                pass
            else:
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    def _repair(self, truncate_after: int | None) -> None:
        """Drop a cut-off final line and, when resuming, records past the checkpoint and lines that are not JSON."""
        if not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").split("\n")
        tail = lines.pop()  # "" when the file ends with a newline
        if tail:
            warnings.warn(f"{self.path}: dropping a cut-off final line ({len(tail)} chars)", stacklevel=3)
        kept = lines
        if truncate_after is not None:
            kept, malformed = [], []
            for lineno, line in enumerate(lines, 1):
                try:
                    rec = json.loads(line) if line.strip() else None
                except json.JSONDecodeError:
                    malformed.append(lineno)
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("update"), int) and rec["update"] > truncate_after:
                    continue
                kept.append(line)
            if malformed:  # skipped and counted, as the cut-off final line is
                warnings.warn(f"{self.path}: dropping {len(malformed)} malformed line(s) (not JSON; line "
                              f"{', '.join(map(str, malformed[:5]))}{', ...' if len(malformed) > 5 else ''})",
                              stacklevel=3)
        if tail or len(kept) != len(lines):
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def write(self, kind: str, update: int, metrics: Mapping[str, Any], time: float | None = None) -> dict[str, Any]:
        """Append one record of ``kind`` (``"update"`` or ``"eval"``) and return it as written."""
        if kind not in self.KINDS:
            raise ValueError(f"MetricsWriter: kind must be one of {self.KINDS}, got {kind!r}")
        if isinstance(update, bool) or not isinstance(update, int) or update < 0:
            raise ValueError(f"MetricsWriter: update must be a non-negative int, got {update!r}")
        reserved = {"kind", "update", "time"} & set(metrics)
        if reserved:
            raise ValueError(f"MetricsWriter: metric names {sorted(reserved)} are reserved")
        elapsed = _time.monotonic() - self._t0 if time is None else float(time)
        record: dict[str, Any] = {"kind": kind, "update": update, "time": round(elapsed, 6)}
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise TypeError(f"MetricsWriter: metric name {key!r} is not a string")
            record[key] = _jsonable(value, key)
        line = json.dumps(record, allow_nan=False, separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                raise ValueError(f"MetricsWriter: {self.path} is closed")
            self._file.write(line + "\n")
            self._file.flush()
            if self._tb is not None:
                for key, value in metrics.items():
                    v = record[key]
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        self._tb.add_scalar(key, v, global_step=update)
                    elif v is None and isinstance(value, float):  # keep NaN/inf visible in TensorBoard
                        self._tb.add_scalar(key, value, global_step=update)
        return record

    def update(self, update: int, metrics: Mapping[str, Any], time: float | None = None) -> dict[str, Any]:
        """Append an ``"update"`` record (one per learner update)."""
        return self.write("update", update, metrics, time)

    def eval(self, update: int, metrics: Mapping[str, Any], time: float | None = None) -> dict[str, Any]:
        """Append an ``"eval"`` record (one per evaluation; carries ``eval/success_rate`` in 0–1)."""
        return self.write("eval", update, metrics, time)

    def flush(self) -> None:
        """Flush TensorBoard events (metrics.jsonl is flushed after every record)."""
        with self._lock:
            if self._tb is not None:
                self._tb.flush()

    def close(self) -> None:
        """Close metrics.jsonl and the TensorBoard writer; idempotent."""
        with self._lock:
            if not self._file.closed:
                self._file.close()
            if self._tb is not None:
                self._tb.close()
                self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
