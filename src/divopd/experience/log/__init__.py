"""Experience logs: every student response turn as it entered the queue, in Parquet (pyarrow), one row per turn.

A log records the queue's input, not any reader's output, so every selection rule can later be replayed over the same
experience (``divopd replay``; the paper's shared-buffer replays, Appendix Table 11). The training pipeline logs each
turn when it enters the queue; ``divopd simulate`` writes synthetic logs.

Columns (``SCHEMA``; *optional* columns may be absent from a log):

- ``rollout_id`` string: rollout (episode) id.
- ``turn_index`` int32: position of the turn in its rollout (>= 0).
- ``policy_version`` int64: student version that generated the response (>= 0).
- ``arrival`` int64: global arrival order (>= 0, strictly increasing down the log).
- ``arrival_update`` int64: learner updates completed when the turn entered the queue (>= 0, non-decreasing).
- ``prompt_truncated`` bool: the explorer truncated the prompt.
- ``prompt_len``, ``response_len`` int32: token counts.
- ``action_mask`` list<bool>: per response token; null = all true.
- ``student_logprobs`` list<float32>: per response token, generating policy; null = not kept.
- ``teacher_logprobs`` list<float32>: per response token; null = not scored; NaN = position not scored.
- ``teacher_valid_mask`` list<bool>: per response token; null = none.
- optional ``prompt_ids``, ``response_ids`` list<int32>: token ids (lengths ``prompt_len``, ``response_len``).
- optional ``success`` bool (nullable, rollout outcome), ``env`` string (nullable), ``teacher_acted`` bool.

Rows are in arrival order. A log is a single ``.parquet`` file or a directory of ``part-*.parquet`` files read in
name order (what a training run appends). Readers stream record batches and never hold the whole log; they reject a
malformed log with :class:`ExperienceLogError` naming the file, the column and the first bad row. Readers accept any
integer width for integer columns and float16/32/64 for log probabilities (cast to the types above); everything else
must match. Nothing is pickled: the files are plain Parquet.

When ``prompt_ids``/``response_ids`` are absent, turns read back carry read-only zero ids of the logged lengths (enough
for selection and batch statistics, which use lengths only). The optional per-token teacher top-k arrays of
:class:`~divopd.experience.turn.Turn` are not logged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from divopd.errors import UsageError
from divopd.experience.turn import Turn

__all__ = [
    "SCHEMA",
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "ExperienceLogError",
    "ExperienceLogWriter",
    "LoggedTurn",
    "iter_record_batches",
    "log_files",
    "read_log",
    "row_to_turn",
    "truncate_log",
    "turn_to_row",
    "validate_batch",
    "validate_schema",
    "write_log",
]

SCHEMA = pa.schema(
    [
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
    ]
)

OPTIONAL_COLUMNS: tuple[str, ...] = ("prompt_ids", "response_ids", "success", "env", "teacher_acted")
REQUIRED_COLUMNS: tuple[str, ...] = tuple(n for n in SCHEMA.names if n not in OPTIONAL_COLUMNS)
#: Columns that may not hold nulls.
NOT_NULL: tuple[str, ...] = tuple(f.name for f in SCHEMA if not f.nullable)
#: Per-token list columns and the length column each must match.
LIST_LENGTHS: dict[str, str] = {
    "action_mask": "response_len",
    "student_logprobs": "response_len",
    "teacher_logprobs": "response_len",
    "teacher_valid_mask": "response_len",
    "prompt_ids": "prompt_len",
    "response_ids": "response_len",
}
#: Integer columns that must be >= 0.
NON_NEGATIVE: tuple[str, ...] = (
    "turn_index",
    "policy_version",
    "arrival",
    "arrival_update",
    "prompt_len",
    "response_len",
)
_INFO_KEYS = ("env", "success", "teacher_acted")
_TOKEN_ARRAYS = ("action_mask", "student_logprobs", "teacher_logprobs", "teacher_valid_mask")
PART_PATTERN = re.compile(r"^part-(\d+)\.parquet$")


class ExperienceLogError(UsageError, ValueError):
    """A malformed experience log; the message names the file, the column and, for content, the first bad row."""


class LoggedTurn(NamedTuple):
    """A turn read back from a log, with its queue-entry tags."""

    turn: Turn
    arrival: int
    arrival_update: int


# ---------------------------------------------------------------------------------------------------- schema checks
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
    """Raise :class:`ExperienceLogError` unless ``schema`` has every required column with an accepted type.

    Optional columns may be missing; unknown extra columns are ignored by readers.
    """
    names = set(schema.names)
    missing = [n for n in REQUIRED_COLUMNS if n not in names]
    if missing:
        raise ExperienceLogError(f"{source}: missing required column(s) {', '.join(repr(m) for m in missing)}")
    for name in SCHEMA.names:
        if name in names and not _type_ok(name, schema.field(name).type):
            raise ExperienceLogError(
                f"{source}: column {name!r} has type {_type_name(schema.field(name).type)}, "
                f"expected {_type_name(SCHEMA.field(name).type)}"
            )


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
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


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


class _OrderState:
    """Carries the last (arrival, arrival_update) across batches and files, to check log order."""

    def __init__(self) -> None:
        self.last_arrival: int | None = None
        self.last_update: int | None = None
        self.rows = 0


def validate_batch(batch: pa.RecordBatch, source: str = "experience log", order: _OrderState | None = None) -> None:
    """Raise :class:`ExperienceLogError` at the first malformed value of a record batch (already conformed).

    Checks: no null in a non-nullable column; non-empty rollout ids; non-negative integers; per-token lists as long
    as ``response_len`` (``prompt_ids``: ``prompt_len``); no null inside a list; ``arrival`` strictly increasing and
    ``arrival_update`` non-decreasing down the log (``order`` carries them across batches).
    """
    base = order.rows if order is not None else 0

    def fail(column: str, row: int, what: str) -> None:
        raise ExperienceLogError(f"{source}: column {column!r}, row {base + row}: {what}")

    names = batch.schema.names
    for name in NOT_NULL:
        if name in names and batch.column(name).null_count:
            fail(name, _first(batch.column(name).is_null().to_numpy(zero_copy_only=False)), "null value")
    rid = batch.column("rollout_id")
    empty = pc.equal(pc.utf8_length(rid), 0).to_numpy(zero_copy_only=False)
    if empty.any():
        fail("rollout_id", _first(empty), "empty rollout id")
    ints = {name: batch.column(name).to_numpy() for name in NON_NEGATIVE}
    for name, values in ints.items():
        bad = values < 0
        if bad.any():
            i = _first(bad)
            fail(name, i, f"negative value {int(values[i])}")
    for name, length_col in LIST_LENGTHS.items():
        if name not in names:
            continue
        arr = batch.column(name)
        lengths = arr.value_lengths().to_numpy(zero_copy_only=False)  # NaN where the list is null
        valid = ~arr.is_null().to_numpy(zero_copy_only=False)
        bad = valid & (lengths != ints[length_col])
        if bad.any():
            i = _first(bad)
            fail(name, i, f"list length {int(lengths[i])} != {length_col} {int(ints[length_col][i])}")
        if arr.values.null_count and not pa.types.is_floating(arr.type.value_type):
            offsets = arr.offsets.to_numpy()
            flat_nulls = np.flatnonzero(arr.values.is_null().to_numpy(zero_copy_only=False))
            flat_nulls = flat_nulls[(flat_nulls >= offsets[0]) & (flat_nulls < offsets[-1])]
            if len(flat_nulls):
                fail(name, int(np.searchsorted(offsets, flat_nulls[0], side="right")) - 1, "null inside a list")
    arrival, update = ints["arrival"], ints["arrival_update"]
    if len(arrival):
        prev_a = order.last_arrival if order is not None else None
        prev_u = order.last_update if order is not None else None
        a = arrival if prev_a is None else np.concatenate([[prev_a], arrival])
        u = update if prev_u is None else np.concatenate([[prev_u], update])
        offset = 0 if prev_a is None else 1
        bad = np.diff(a) <= 0
        if bad.any():
            i = _first(bad)
            fail(
                "arrival",
                i + 1 - offset,
                f"arrival {int(a[i + 1])} after {int(a[i])}: rows must be in strictly increasing arrival order",
            )
        bad = np.diff(u) < 0
        if bad.any():
            i = _first(bad)
            fail(
                "arrival_update",
                i + 1 - offset,
                f"arrival_update {int(u[i + 1])} after {int(u[i])}: must not decrease in arrival order",
            )
        if order is not None:
            order.last_arrival, order.last_update = int(arrival[-1]), int(update[-1])
    if order is not None:
        order.rows += batch.num_rows


# ---------------------------------------------------------------------------------------------------- reading
def log_files(path: str | os.PathLike) -> list[Path]:
    """The Parquet files of a log: ``path`` itself, or a directory's ``part-*.parquet`` files in name order."""
    p = Path(path)
    if p.is_dir():
        parts = sorted(f for f in p.iterdir() if PART_PATTERN.match(f.name))
        if not parts:
            raise ExperienceLogError(f"{p}: directory holds no part-*.parquet files")
        return parts
    if not p.exists():
        raise ExperienceLogError(f"{p}: no such experience log")
    return [p]


def _open(path: Path) -> pq.ParquetFile:
    # pre_buffer (pyarrow's default) keeps read column chunks cached for the file's lifetime: memory would grow with
    # the log. A buffered stream reads each row group once and lets it go.
    try:
        return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ExperienceLogError(f"{path}: not a readable Parquet file ({exc})") from None


def iter_record_batches(
    path: str | os.PathLike, batch_size: int = 8192, columns: Iterable[str] | None = None, validate: bool = True
) -> Iterator[pa.RecordBatch]:
    """Stream a log's record batches (schema-checked, cast to :data:`SCHEMA` types, content-validated)."""
    order = _OrderState()
    wanted = None if columns is None else list(columns)
    for file in log_files(path):
        pf = _open(file)
        validate_schema(pf.schema_arrow, str(file))
        cols = None
        if wanted is not None:
            needed = set(wanted) | ({"arrival", "arrival_update", "rollout_id", *NON_NEGATIVE} if validate else set())
            needed |= {LIST_LENGTHS[c] for c in wanted if c in LIST_LENGTHS}
            cols = [n for n in SCHEMA.names if n in needed and n in pf.schema_arrow.names]
        for batch in pf.iter_batches(batch_size=batch_size, columns=cols):
            batch = _conform(batch)
            if validate:
                validate_batch(batch, str(file), order)
            yield batch


_ZEROS = np.zeros(0, dtype=np.int32)


def _zeros(n: int) -> np.ndarray:
    """A read-only int32 zero view of length ``n`` (shared buffer: placeholder token ids)."""
    global _ZEROS
    if n > _ZEROS.shape[0]:
        _ZEROS = np.zeros(max(n, 2 * _ZEROS.shape[0], 4096), dtype=np.int32)
        _ZEROS.setflags(write=False)
    return _ZEROS[:n]


def _list_column(batch: pa.RecordBatch, name: str, dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(offsets, flat values, is_null) of a list column, or ``None`` when the column is absent."""
    if name not in batch.schema.names:
        return None
    arr = batch.column(name)
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    nulls = arr.is_null().to_numpy(zero_copy_only=False)
    return offsets, values, nulls


def batch_to_turns(batch: pa.RecordBatch) -> Iterator[LoggedTurn]:
    """Turns of one conformed record batch; per-token arrays are views into the batch's buffers (no per-row copy)."""
    n = batch.num_rows
    names = batch.schema.names
    rollout_ids = batch.column("rollout_id").to_pylist()
    col = {name: batch.column(name).to_numpy(zero_copy_only=False) for name in (*NON_NEGATIVE, "prompt_truncated")}
    lists = {
        "action_mask": _list_column(batch, "action_mask", bool),
        "student_logprobs": _list_column(batch, "student_logprobs", np.float32),
        "teacher_logprobs": _list_column(batch, "teacher_logprobs", np.float32),
        "teacher_valid_mask": _list_column(batch, "teacher_valid_mask", bool),
        "prompt_ids": _list_column(batch, "prompt_ids", np.int32),
        "response_ids": _list_column(batch, "response_ids", np.int32),
    }
    info_cols = {k: batch.column(k).to_pylist() for k in _INFO_KEYS if k in names}

    def get(name: str, i: int) -> np.ndarray | None:
        spec = lists[name]
        if spec is None:
            return None
        offsets, values, nulls = spec
        return None if nulls[i] else values[offsets[i] : offsets[i + 1]]

    for i in range(n):
        prompt_ids = get("prompt_ids", i)
        response_ids = get("response_ids", i)
        info = {k: v[i] for k, v in info_cols.items() if v[i] is not None}
        turn = Turn(
            rollout_id=rollout_ids[i],
            turn_index=int(col["turn_index"][i]),
            policy_version=int(col["policy_version"][i]),
            prompt_ids=_zeros(int(col["prompt_len"][i])) if prompt_ids is None else prompt_ids,
            response_ids=_zeros(int(col["response_len"][i])) if response_ids is None else response_ids,
            action_mask=get("action_mask", i),
            student_logprobs=get("student_logprobs", i),
            teacher_logprobs=get("teacher_logprobs", i),
            teacher_valid_mask=get("teacher_valid_mask", i),
            prompt_truncated=bool(col["prompt_truncated"][i]),
            info=info,
        )
        yield LoggedTurn(turn, int(col["arrival"][i]), int(col["arrival_update"][i]))


def read_log(
    path: str | os.PathLike, batch_size: int = 8192, validate: bool = True, require_ids: bool = False
) -> Iterator[LoggedTurn]:
    """Stream a log as :class:`LoggedTurn` ``(turn, arrival, arrival_update)`` in arrival order.

    Holds one record batch (``batch_size`` rows) at a time, plus whatever turns the caller keeps: a turn's arrays are
    views into its batch's buffers. Without ``prompt_ids``/``response_ids`` the turns carry zero placeholder ids, fine
    for selection but not for training: pass ``require_ids=True`` where real token ids are needed (e.g. re-queueing
    logged turns for a learner), and a log without them is rejected.
    """
    for batch in iter_record_batches(path, batch_size=batch_size, validate=validate):
        if require_ids:
            for name in ("prompt_ids", "response_ids"):
                if name not in batch.schema.names:
                    raise ExperienceLogError(f"{path}: column {name!r} is missing; this log holds no token ids")
                if batch.column(name).null_count:
                    row = _first(batch.column(name).is_null().to_numpy(zero_copy_only=False))
                    raise ExperienceLogError(f"{path}: column {name!r}: null token ids in batch row {row}")
        yield from batch_to_turns(batch)


def row_to_turn(row: dict[str, Any]) -> Turn:
    """A :class:`Turn` from one log row as a plain dict (e.g. ``Table.to_pylist()``); arrival tags are in the row."""
    info = {k: row[k] for k in _INFO_KEYS if row.get(k) is not None}
    prompt_ids = row.get("prompt_ids")
    response_ids = row.get("response_ids")

    def floats(values: list | None) -> np.ndarray | None:
        return None if values is None else np.array([np.nan if v is None else v for v in values], dtype=np.float32)

    return Turn(
        rollout_id=row["rollout_id"],
        turn_index=row["turn_index"],
        policy_version=row["policy_version"],
        prompt_ids=_zeros(row["prompt_len"]) if prompt_ids is None else prompt_ids,
        response_ids=_zeros(row["response_len"]) if response_ids is None else response_ids,
        action_mask=row.get("action_mask"),
        student_logprobs=floats(row.get("student_logprobs")),
        teacher_logprobs=floats(row.get("teacher_logprobs")),
        teacher_valid_mask=row.get("teacher_valid_mask"),
        prompt_truncated=row["prompt_truncated"],
        info=info,
    )


# ---------------------------------------------------------------------------------------------------- writing
def turn_to_row(turn: Turn, arrival: int, arrival_update: int, write_ids: bool = False) -> dict[str, Any]:
    """One log row (column -> value; per-token arrays as numpy arrays) for ``turn`` entering the queue.

    ``info`` keys ``env``, ``success`` and ``teacher_acted`` fill the metadata columns. Token ids are included only
    with ``write_ids`` (prompt ids grow with the history; logging them for every turn is costly).

    A turn with a per-token array whose length differs from the response (including the teacher top-k arrays, which
    are not logged) stays invalid in the log: the misfit arrays and ``teacher_logprobs`` are logged as null, so a
    replay's gate rejects it (as ``missing_teacher`` instead of ``length_mismatch``).
    """
    info = turn.info or {}
    success = info.get("success")
    env = info.get("env")
    arrays = {name: getattr(turn, name) for name in _TOKEN_ARRAYS}
    if turn.length_mismatch is not None:
        # The log cannot hold a per-token array of the wrong length. Such a turn is invalid (gate: length_mismatch);
        # keep it invalid in the log: drop the misfit arrays and the teacher scores (gate: missing_teacher).
        for name in _TOKEN_ARRAYS:
            if arrays[name] is not None and arrays[name].shape[0] != turn.response_len:
                arrays[name] = None
        arrays["teacher_logprobs"] = None
    row: dict[str, Any] = {
        "rollout_id": turn.rollout_id,
        "turn_index": turn.turn_index,
        "policy_version": turn.policy_version,
        "arrival": int(arrival),
        "arrival_update": int(arrival_update),
        "prompt_truncated": bool(turn.prompt_truncated),
        "prompt_len": turn.prompt_len,
        "response_len": turn.response_len,
        **arrays,
        "success": None if success is None else bool(success),
        "env": None if env is None else str(env),
        "teacher_acted": bool(info.get("teacher_acted", False)),
    }
    if write_ids:
        row["prompt_ids"] = turn.prompt_ids
        row["response_ids"] = turn.response_ids
    return row


def _list_array(values: list[np.ndarray | None], value_type: pa.DataType, dtype: Any) -> pa.Array:
    """A list array from per-row numpy arrays (``None`` = null list), built from one flat buffer."""
    lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [v for v in values if v is not None and len(v)]
    flat = np.concatenate(present).astype(dtype, copy=False) if present else np.zeros(0, dtype=dtype)
    mask = pa.array([v is None for v in values], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=value_type), mask=mask)


def rows_to_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """A record batch (schema :data:`SCHEMA`, optional id columns only when every row has them) from log rows."""
    with_ids = bool(rows) and all("prompt_ids" in r for r in rows)
    arrays, fields = [], []
    for field in SCHEMA:
        name = field.name
        if name in ("prompt_ids", "response_ids") and not with_ids:
            continue
        values = [r[name] for r in rows]
        if pa.types.is_list(field.type):
            inner = field.type.value_type
            dtype = bool if pa.types.is_boolean(inner) else inner.to_pandas_dtype()
            arrays.append(_list_array(values, inner, dtype))
        else:
            arrays.append(pa.array(values, type=field.type))
        fields.append(field)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class ExperienceLogWriter:
    """Append turns to an experience log as they enter the queue, in streaming row groups.

    ``path`` ending in ``.parquet`` writes one file (which must not exist unless ``overwrite``). Any other ``path`` is
    a directory of ``part-NNNNNN.parquet`` files: a new writer on an existing directory continues it (next part
    number, arrivals after the last logged one), so a resumed training run appends. A part is finalised when it
    reaches ``rows_per_file`` rows, on :meth:`roll` and on :meth:`close`; an unfinished part is unreadable after a
    crash, so long runs should keep parts modest or call :meth:`roll` at checkpoints.

    Rows are validated on the way in (types, lengths, non-negative integers, arrival order).

    Resuming from a checkpoint: the log may hold rows logged after the checkpoint (and a crashed, unreadable last
    part). ``truncate_from=A`` first drops every row with ``arrival >= A`` (:func:`truncate_log`), A being the
    restored sampler's next arrival number, so the log again matches the queue the resumed run continues.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        row_group_size: int = 8192,
        rows_per_file: int = 1 << 20,
        write_ids: bool = False,
        overwrite: bool = False,
        truncate_from: int | None = None,
    ) -> None:
        if row_group_size < 1 or rows_per_file < 1:
            raise ValueError("row_group_size and rows_per_file must be >= 1")
        self.path = Path(path)
        self.single_file = self.path.suffix == ".parquet"
        self.row_group_size = row_group_size
        self.rows_per_file = rows_per_file
        self.write_ids = write_ids
        self._rows: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0
        self._order = _OrderState()
        self._next_part = 0
        self.rows_written = 0
        self._closed = False
        self._schema: pa.Schema | None = None
        if self.single_file:
            if self.path.exists() and not overwrite:
                raise FileExistsError(
                    f"{self.path} exists (Parquet files cannot be appended; pass overwrite=True "
                    "or log to a directory of part files)"
                )
            self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            if truncate_from is not None:
                truncate_log(self.path, truncate_from)
            parts = sorted(f for f in self.path.iterdir() if PART_PATTERN.match(f.name))
            if parts:
                self._next_part = int(PART_PATTERN.match(parts[-1].name).group(1)) + 1
            for part in reversed(parts):  # the last non-empty part holds the last arrival
                try:
                    tail = pq.read_table(part, columns=["arrival", "arrival_update"])
                except (pa.ArrowInvalid, OSError) as exc:
                    raise ExperienceLogError(
                        f"{part}: unreadable part ({exc}); a run that crashed mid-part resumes with "
                        "ExperienceLogWriter(..., truncate_from=<first arrival after the checkpoint>)"
                    ) from None
                if tail.num_rows:
                    self._order.last_arrival = int(tail.column("arrival")[-1].as_py())
                    self._order.last_update = int(tail.column("arrival_update")[-1].as_py())
                    break

    @property
    def next_arrival(self) -> int:
        """The arrival number :meth:`append` assigns when none is given."""
        pending = self._rows[-1]["arrival"] if self._rows else self._order.last_arrival
        return 0 if pending is None else pending + 1

    def append(self, turn: Turn, arrival_update: int, arrival: int | None = None) -> int:
        """Log one turn entering the queue after ``arrival_update`` learner updates; returns its arrival number."""
        if self._closed:
            raise ValueError("ExperienceLogWriter is closed")
        if not isinstance(turn, Turn):
            raise TypeError(f"ExperienceLogWriter.append expects a divopd.Turn, got {type(turn).__name__}")
        arrival = self.next_arrival if arrival is None else int(arrival)
        self._rows.append(turn_to_row(turn, arrival, arrival_update, self.write_ids))
        if len(self._rows) >= self.row_group_size:
            self.flush()
        return arrival

    def extend(self, turns: Iterable[Turn], arrival_update: int, arrivals: Iterable[int] | None = None) -> list[int]:
        """Log several turns entering the queue together (e.g. one finished rollout)."""
        if arrivals is None:
            return [self.append(t, arrival_update) for t in turns]
        return [self.append(t, arrival_update, a) for t, a in zip(turns, arrivals, strict=True)]

    def write_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Write columnar rows directly (for producers that build columns, e.g. ``divopd simulate``)."""
        if self._closed:
            raise ValueError("ExperienceLogWriter is closed")
        self.flush()
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        for b in batches:
            validate_schema(b.schema, str(self.path))
            self._write(_conform(b))

    def flush(self) -> None:
        """Write buffered rows as a row group."""
        if self._rows:
            rows, self._rows = self._rows, []
            self._write(rows_to_batch(rows))

    def _write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        validate_batch(batch, str(self.path), self._order)
        start = 0
        while start < batch.num_rows:
            if self._writer is None:
                self._open_file(batch.schema)
            elif batch.schema != self._schema:
                raise ExperienceLogError(
                    f"{self.path}: rows with different columns ({batch.schema.names}) cannot "
                    f"join a file with {self._schema.names}"
                )
            take = batch.num_rows - start
            if not self.single_file:
                take = min(take, self.rows_per_file - self._file_rows)
            self._writer.write_batch(batch.slice(start, take), row_group_size=self.row_group_size)
            self._file_rows += take
            self.rows_written += take
            start += take
            if not self.single_file and self._file_rows >= self.rows_per_file:
                self.roll()

    def _open_file(self, schema: pa.Schema) -> None:
        if self.single_file:
            target = self.path
        else:
            target = self.path / f"part-{self._next_part:06d}.parquet"
            self._next_part += 1
        self._schema = schema
        self._writer = pq.ParquetWriter(target, schema, compression="zstd")
        self._file_rows = 0

    def roll(self) -> None:
        """Finalise the current part file (directory logs); the next rows start a new part."""
        if self.single_file:
            self.flush()
            return
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        """Flush and finalise. A single-file log with no rows is still written (empty, with the schema)."""
        if self._closed:
            return
        self.flush()
        if self._writer is None and self.single_file:
            schema = pa.schema([f for f in SCHEMA if self.write_ids or f.name not in ("prompt_ids", "response_ids")])
            self._open_file(schema)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._closed = True

    def __enter__(self) -> ExperienceLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def set_aside_unreadable_parts(path: str | os.PathLike) -> list[Path]:
    """Rename the part files of a directory log that cannot be opened (a crash before the footer was written) to
    ``<name>.unreadable``, so readers and appending writers leave them out; returns the new paths."""
    d = Path(path)
    moved: list[Path] = []
    if not d.is_dir():
        return moved
    for part in sorted(f for f in d.iterdir() if PART_PATTERN.match(f.name)):
        try:
            pq.ParquetFile(part)
        except (pa.ArrowInvalid, OSError):
            target = part.with_name(part.name + ".unreadable")
            part.rename(target)
            moved.append(target)
    return moved


def truncate_log(path: str | os.PathLike, first_dropped_arrival: int) -> int:
    """Drop the rows with ``arrival >= first_dropped_arrival`` from a part-directory log; returns rows dropped.

    Parts entirely past the cut are deleted; the part straddling it is rewritten. An unreadable part (a crash before
    its footer was written) is renamed to ``<name>.unreadable`` and left out of the log.
    """
    d = Path(path)
    if not d.is_dir():
        raise ExperienceLogError(f"{d}: truncate_log works on a directory of part files")
    set_aside_unreadable_parts(d)
    dropped = 0
    for part in sorted(f for f in d.iterdir() if PART_PATTERN.match(f.name)):
        arrivals = pq.read_table(part, columns=["arrival"]).column("arrival").to_numpy()
        keep = arrivals < first_dropped_arrival
        if keep.all():
            continue
        dropped += int((~keep).sum())
        if not keep.any():
            part.unlink()
            continue
        table = pq.read_table(part).filter(pa.array(keep))
        tmp = part.with_name(part.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        tmp.replace(part)
    return dropped


def write_log(
    path: str | os.PathLike,
    turns: Iterable[LoggedTurn | tuple[Turn, int, int] | Turn],
    write_ids: bool = False,
    overwrite: bool = False,
    row_group_size: int = 8192,
) -> int:
    """Write a whole log from ``(turn, arrival, arrival_update)`` triples (a bare Turn gets the next arrival and
    ``arrival_update`` 0); returns the number of rows written."""
    with ExperienceLogWriter(path, row_group_size=row_group_size, write_ids=write_ids, overwrite=overwrite) as writer:
        for item in turns:
            if isinstance(item, Turn):
                writer.append(item, 0)
            else:
                turn, arrival, arrival_update = item
                writer.append(turn, arrival_update, arrival)
    return writer.rows_written
