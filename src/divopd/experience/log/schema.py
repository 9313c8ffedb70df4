"""The experience log's columns (:data:`SCHEMA`) and its checks: column types (:func:`validate_schema`) and content
(:func:`validate_batch`: nulls, lengths, signs, arrival order)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from divopd.errors import UsageError
from divopd.experience.turn import Turn

SCHEMA = pa.schema([
    pa.field("rollout_id", pa.string(), nullable=False),
    pa.field("turn_index", pa.int32(), nullable=False),
    pa.field("policy_version", pa.int64(), nullable=False),
    pa.field("arrival", pa.int64(), nullable=False),
    pa.field("arrival_update", pa.int64(), nullable=False),
    pa.field("prompt_truncated", pa.bool_(), nullable=False),
    pa.field("prompt_len", pa.int32(), nullable=False),
    pa.field("response_len", pa.int32(), nullable=False),
    pa.field("action_mask", pa.list_(pa.bool_())),
    pa.field("student_logprobs", pa.list_(pa.float32())),
    pa.field("teacher_logprobs", pa.list_(pa.float32())),
    pa.field("teacher_valid_mask", pa.list_(pa.bool_())),
    pa.field("prompt_ids", pa.list_(pa.int32())),
    pa.field("response_ids", pa.list_(pa.int32())),
    pa.field("success", pa.bool_()),
    pa.field("env", pa.string()),
    pa.field("teacher_acted", pa.bool_(), nullable=False),
    pa.field("task", pa.string()),
])

OPTIONAL_COLUMNS: tuple[str, ...] = ("prompt_ids", "response_ids", "success", "env", "teacher_acted", "task")
REQUIRED_COLUMNS: tuple[str, ...] = tuple(n for n in SCHEMA.names if n not in OPTIONAL_COLUMNS)
#: Columns that may not hold nulls.
NOT_NULL: tuple[str, ...] = tuple(f.name for f in SCHEMA if not f.nullable)
TOKEN_ARRAYS = ("action_mask", "student_logprobs", "teacher_logprobs", "teacher_valid_mask")
#: Per-token list columns and the length column each must match.
LIST_LENGTHS: dict[str, str] = {**dict.fromkeys(TOKEN_ARRAYS, "response_len"), "prompt_ids": "prompt_len",
                                "response_ids": "response_len"}
#: Integer columns that must be >= 0.
NON_NEGATIVE: tuple[str, ...] = ("turn_index", "policy_version", "arrival", "arrival_update", "prompt_len",
                                 "response_len")
INFO_KEYS = ("env", "success", "teacher_acted", "task")  # task: divopd-focus groups by it
#: A part file of a directory log: ``part-N.parquet`` (one write) or ``part-A-B.parquet`` (parts A..B compacted into
#: one file, :func:`~divopd.experience.log.parts.compact_parts`); numbers are zero-padded to 6 digits and ordered as
#: numbers at any count.
PART_PATTERN = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")


class ExperienceLogError(UsageError, ValueError):
    """A malformed experience log; the message names the file, the column and, for content, the first bad row."""


class LoggedTurn(NamedTuple):
    """A turn read back from a log, with its queue-entry tags."""

    turn: Turn
    arrival: int
    arrival_update: int


def _type_ok(name: str, actual: pa.DataType) -> bool:
    """Whether ``actual`` is the schema type of column ``name`` or a safe-to-cast equivalent."""
    expected = SCHEMA.field(name).type
    if actual == expected:
        return True
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    if pa.types.is_string(expected):
        return pa.types.is_large_string(actual)
    if pa.types.is_list(expected):
        if not (pa.types.is_list(actual) or pa.types.is_large_list(actual)):
            return False
        inner, got = expected.value_type, actual.value_type
        if pa.types.is_floating(inner):
            return pa.types.is_floating(got)
        if pa.types.is_integer(inner):
            return pa.types.is_integer(got)
        return got == inner
    return False


def _type_name(t: pa.DataType) -> str:
    """``list<float32>`` rather than pyarrow's ``list<item: float>``."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_type_name(t.value_type)}>"
    return {"float": "float32", "double": "float64", "halffloat": "float16"}.get(str(t), str(t))


def validate_schema(schema: pa.Schema, source: str = "experience log") -> None:
    """Raise :class:`ExperienceLogError` unless ``schema`` has every required column with an accepted type (optional
    columns may be missing; readers ignore unknown ones)."""
    names = set(schema.names)
    missing = [n for n in REQUIRED_COLUMNS if n not in names]
    if missing:
        raise ExperienceLogError(f"{source}: missing required column(s) {', '.join(repr(m) for m in missing)}")
    for name in SCHEMA.names:
        if name in names and not _type_ok(name, schema.field(name).type):
            raise ExperienceLogError(f"{source}: column {name!r} has type {_type_name(schema.field(name).type)}, "
                                     f"expected {_type_name(SCHEMA.field(name).type)}")


def conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Cast accepted equivalents to the schema's types and keep only known columns, in schema order."""
    arrays, fields = [], []
    for field in SCHEMA:
        if field.name not in batch.schema.names:
            continue
        arr = batch.column(field.name)
        if arr.type != field.type:
            arr = arr.cast(field.type)  # safe cast: raises on overflow
        arrays.append(arr)
        fields.append(pa.field(field.name, field.type, nullable=field.nullable))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def first_index(mask: np.ndarray) -> int:
    """The index of the first true value of ``mask`` (a bad row, for the error message)."""
    return int(np.flatnonzero(mask)[0])


@dataclass
class OrderState:
    """Carries the last (arrival, arrival_update) and the row count across batches and files, to check log order."""

    last_arrival: int | None = None
    last_update: int | None = None
    rows: int = 0


def validate_batch(batch: pa.RecordBatch, source: str = "experience log", order: OrderState | None = None) -> None:
    """Raise :class:`ExperienceLogError` at the first malformed value of a conformed record batch: a null in a
    non-nullable column or inside a list, an empty rollout id, a negative integer, a per-token list not as long as its
    length column, ``arrival`` not increasing or ``arrival_update`` decreasing (``order``: across batches)."""
    order = OrderState() if order is None else order

    def fail(column: str, row: int, what: str) -> None:
        raise ExperienceLogError(f"{source}: column {column!r}, row {order.rows + row}: {what}")

    ints = _check_values(batch, fail)
    _check_lists(batch, ints, fail)
    _check_order(ints["arrival"], ints["arrival_update"], order, fail)
    order.rows += batch.num_rows


def _check_values(batch: pa.RecordBatch, fail: Callable[[str, int, str], None]) -> dict[str, np.ndarray]:
    """Nulls in non-nullable columns, empty rollout ids, negative integers; returns the integer columns."""
    names = batch.schema.names
    for name in NOT_NULL:
        if name in names and batch.column(name).null_count:
            fail(name, first_index(batch.column(name).is_null().to_numpy(zero_copy_only=False)), "null value")
    empty = pc.equal(pc.utf8_length(batch.column("rollout_id")), 0).to_numpy(zero_copy_only=False)
    if empty.any():
        fail("rollout_id", first_index(empty), "empty rollout id")
    ints = {name: batch.column(name).to_numpy() for name in NON_NEGATIVE}
    for name, values in ints.items():
        bad = values < 0
        if bad.any():
            i = first_index(bad)
            fail(name, i, f"negative value {int(values[i])}")
    return ints


def _check_lists(batch: pa.RecordBatch, ints: dict[str, np.ndarray], fail: Callable[[str, int, str], None]) -> None:
    """Per-token lists as long as their length column, and no null inside a (non-float) list."""
    names = batch.schema.names
    for name, length_col in LIST_LENGTHS.items():
        if name not in names:
            continue
        arr = batch.column(name)
        lengths = arr.value_lengths().to_numpy(zero_copy_only=False)  # NaN where the list is null
        valid = ~arr.is_null().to_numpy(zero_copy_only=False)
        bad = valid & (lengths != ints[length_col])
        if bad.any():
            i = first_index(bad)
            fail(name, i, f"list length {int(lengths[i])} != {length_col} {int(ints[length_col][i])}")
        if arr.values.null_count and not pa.types.is_floating(arr.type.value_type):
            offsets = arr.offsets.to_numpy()
            flat_nulls = np.flatnonzero(arr.values.is_null().to_numpy(zero_copy_only=False))
            flat_nulls = flat_nulls[(flat_nulls >= offsets[0]) & (flat_nulls < offsets[-1])]
            if len(flat_nulls):
                fail(name, int(np.searchsorted(offsets, flat_nulls[0], side="right")) - 1, "null inside a list")


def _check_order(arrival: np.ndarray, update: np.ndarray, order: OrderState,
                 fail: Callable[[str, int, str], None]) -> None:
    """``arrival`` strictly increasing and ``arrival_update`` non-decreasing, from ``order``'s last row on."""
    if not len(arrival):
        return
    offset = 0 if order.last_arrival is None else 1
    rules = (("arrival", arrival, order.last_arrival, True, "rows must be in strictly increasing arrival order"),
             ("arrival_update", update, order.last_update, False, "must not decrease in arrival order"))
    for name, values, last, strict, rule in rules:
        v = values if last is None else np.concatenate([[last], values])
        bad = np.diff(v) <= 0 if strict else np.diff(v) < 0
        if bad.any():
            i = first_index(bad)
            fail(name, i + 1 - offset, f"{name} {int(v[i + 1])} after {int(v[i])}: {rule}")
    order.last_arrival, order.last_update = int(arrival[-1]), int(update[-1])
