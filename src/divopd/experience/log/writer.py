"""Writing experience logs: log rows from turns (:func:`turn_to_row`, :func:`rows_to_batch`), the streaming
:class:`ExperienceLogWriter` (single file or a directory of parts, resumable) and :func:`write_log`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from divopd.experience.log.parts import (
    compact_parts,
    next_part_number,
    part_files,
    remove_covered_parts,
    remove_unfinished_writes,
    truncate_log,
    write_part,
)
from divopd.experience.log.schema import (
    SCHEMA,
    TOKEN_ARRAYS,
    ExperienceLogError,
    LoggedTurn,
    OrderState,
    conform,
    validate_batch,
    validate_schema,
)
from divopd.experience.turn import Turn


def turn_to_row(turn: Turn, arrival: int, arrival_update: int, write_ids: bool = False) -> dict[str, Any]:
    """One log row (column -> value) for ``turn`` entering the queue; token ids only with ``write_ids``. A turn whose
    arrays misfit its response stays invalid: those arrays and ``teacher_logprobs`` are logged as null."""
    info = turn.info or {}
    success = info.get("success")
    env, task = info.get("env"), info.get("task")
    arrays = {name: getattr(turn, name) for name in TOKEN_ARRAYS}
    if turn.length_mismatch is not None:
        for name in TOKEN_ARRAYS:
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
        "task": None if task is None else str(task),
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
        if field.name in ("prompt_ids", "response_ids") and not with_ids:
            continue
        values = [r[field.name] for r in rows]
        if pa.types.is_list(field.type):
            inner = field.type.value_type
            dtype = bool if pa.types.is_boolean(inner) else inner.to_pandas_dtype()
            arrays.append(_list_array(values, inner, dtype))
        else:
            arrays.append(pa.array(values, type=field.type))
        fields.append(field)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class ExperienceLogWriter:
    """Append turns to an experience log as they enter the queue, validated on the way in (docs/guides/replay.md).

    A ``path`` ending in ``.parquet`` is one file (refused if it exists unless ``overwrite``), finalised on
    :meth:`close`; any other is a directory of part files, continued by a new writer, each :meth:`flush` writing
    whole parts of at most ``rows_per_file`` rows. ``truncate_from=A`` first drops the rows logged from arrival A on."""

    def __init__(self, path: str | os.PathLike, row_group_size: int = 8192, rows_per_file: int = 1 << 20,
                 write_ids: bool = False, overwrite: bool = False, truncate_from: int | None = None) -> None:
        if row_group_size < 1 or rows_per_file < 1:
            raise ValueError("row_group_size and rows_per_file must be >= 1")
        self.path = Path(path)
        self.single_file = self.path.suffix == ".parquet"
        self.row_group_size = row_group_size
        self.rows_per_file = rows_per_file
        self.write_ids = write_ids
        self._rows: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._order = OrderState()
        self._next_part = 0
        self.rows_written = 0
        self._closed = False
        self._schema: pa.Schema | None = None
        if self.single_file:
            if self.path.exists() and not overwrite:
                raise FileExistsError(f"{self.path} exists (Parquet files cannot be appended; pass overwrite=True "
                                      "or log to a directory of part files)")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            remove_unfinished_writes(self.path)
            if truncate_from is not None:
                truncate_log(self.path, truncate_from)
            remove_covered_parts(self.path)
            self._next_part = next_part_number(self.path)
            for part in reversed(part_files(self.path)):  # the last non-empty part holds the last arrival
                try:
                    tail = pq.read_table(part, columns=["arrival", "arrival_update"])
                except (pa.ArrowInvalid, OSError) as exc:
                    raise ExperienceLogError(f"{part}: unreadable part ({exc}); a run that crashed mid-part resumes "
                                             "with ExperienceLogWriter(..., truncate_from=<first arrival after the "
                                             "checkpoint>)") from None
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
        """Log several turns entering the queue together; a directory log has them on disk when this returns."""
        if arrivals is None:
            out = [self.append(t, arrival_update) for t in turns]
        else:
            out = [self.append(t, arrival_update, a) for t, a in zip(turns, arrivals, strict=True)]
        if not self.single_file:
            self.flush()
        return out

    def write_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Write columnar rows directly (for producers that build columns, e.g. ``divopd simulate``)."""
        if self._closed:
            raise ValueError("ExperienceLogWriter is closed")
        self.flush()
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        for b in batches:
            validate_schema(b.schema, str(self.path))
            self._write(conform(b))

    def flush(self) -> None:
        """Write buffered rows as a row group."""
        if self._rows:
            rows, self._rows = self._rows, []
            self._write(rows_to_batch(rows))

    def _write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        validate_batch(batch, str(self.path), self._order)
        if self._schema is not None and batch.schema != self._schema:
            raise ExperienceLogError(f"{self.path}: rows with different columns ({batch.schema.names}) cannot join a "
                                     f"{'file' if self.single_file else 'log'} with {self._schema.names}")
        if self.single_file:
            if self._writer is None:
                self._open_file(batch.schema)
            self._writer.write_batch(batch, row_group_size=self.row_group_size)
            self.rows_written += batch.num_rows
            return
        self._schema = batch.schema  # a directory log: new whole parts of at most rows_per_file rows each
        for start in range(0, batch.num_rows, self.rows_per_file):
            chunk = pa.Table.from_batches([batch.slice(start, self.rows_per_file)])
            write_part(chunk, self.path / f"part-{self._next_part:06d}.parquet", self.row_group_size)
            self._next_part += 1
            self.rows_written += chunk.num_rows

    def _open_file(self, schema: pa.Schema) -> None:
        self._schema = schema
        self._writer = pq.ParquetWriter(self.path, schema, compression="zstd")

    def roll(self) -> None:
        """Write what is buffered (the same as :meth:`flush`)."""
        self.flush()

    def compact(self) -> Path | None:
        """Write what is buffered, then merge the parts written since the last compaction
        (:func:`~divopd.experience.log.parts.compact_parts`); returns the merged part (``None``: nothing merged)."""
        self.flush()
        return None if self.single_file else compact_parts(self.path, self.row_group_size)

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


def write_log(path: str | os.PathLike, turns: Iterable[LoggedTurn | tuple[Turn, int, int] | Turn],
              write_ids: bool = False, overwrite: bool = False, row_group_size: int = 8192) -> int:
    """Write ``(turn, arrival, arrival_update)`` triples (a bare Turn: next arrival, update 0); returns rows written."""
    with ExperienceLogWriter(path, row_group_size=row_group_size, write_ids=write_ids, overwrite=overwrite) as writer:
        for item in turns:
            if isinstance(item, Turn):
                writer.append(item, 0)
            else:
                turn, arrival, arrival_update = item
                writer.append(turn, arrival_update, arrival)
    return writer.rows_written
