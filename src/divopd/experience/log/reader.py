"""Reading experience logs: streaming, schema-checked record batches (:func:`iter_record_batches`) and the turns in
them (:func:`read_log`, :func:`batch_to_turns`, :func:`row_to_turn`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from divopd.experience.log.parts import log_files
from divopd.experience.log.schema import (
    INFO_KEYS,
    LIST_LENGTHS,
    NON_NEGATIVE,
    SCHEMA,
    ExperienceLogError,
    LoggedTurn,
    OrderState,
    conform,
    first_index,
    validate_batch,
    validate_schema,
)
from divopd.experience.turn import Turn


def _open(path: Path) -> pq.ParquetFile:
    # not pre_buffer (pyarrow's default), which caches every chunk read for the file's lifetime
    try:
        return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ExperienceLogError(f"{path}: not a readable Parquet file ({exc})") from None


def iter_record_batches(path: str | os.PathLike, batch_size: int = 8192, columns: Iterable[str] | None = None,
                        validate: bool = True) -> Iterator[pa.RecordBatch]:
    """Stream a log's record batches (schema-checked, cast to :data:`SCHEMA` types, content-validated)."""
    order = OrderState()
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
            batch = conform(batch)
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
    return (arr.offsets.to_numpy(), arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False),
            arr.is_null().to_numpy(zero_copy_only=False))


def batch_to_turns(batch: pa.RecordBatch) -> Iterator[LoggedTurn]:
    """Turns of one conformed record batch; per-token arrays are views into the batch's buffers (no per-row copy)."""
    names = batch.schema.names
    rollout_ids = batch.column("rollout_id").to_pylist()
    col = {name: batch.column(name).to_numpy(zero_copy_only=False) for name in (*NON_NEGATIVE, "prompt_truncated")}
    dtypes = {"action_mask": bool, "student_logprobs": np.float32, "teacher_logprobs": np.float32,
              "teacher_valid_mask": bool, "prompt_ids": np.int32, "response_ids": np.int32}
    lists = {name: _list_column(batch, name, dtype) for name, dtype in dtypes.items()}
    info_cols = {k: batch.column(k).to_pylist() for k in INFO_KEYS if k in names}

    def get(name: str, i: int) -> np.ndarray | None:
        spec = lists[name]
        if spec is None:
            return None
        offsets, values, nulls = spec
        return None if nulls[i] else values[offsets[i] : offsets[i + 1]]

    for i in range(batch.num_rows):
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


def read_log(path: str | os.PathLike, batch_size: int = 8192, validate: bool = True,
             require_ids: bool = False) -> Iterator[LoggedTurn]:
    """Stream a log as :class:`LoggedTurn` in arrival order, one record batch at a time (arrays are views into it); a
    log without token ids gives zero placeholder ids, or :class:`ExperienceLogError` with ``require_ids``."""
    for batch in iter_record_batches(path, batch_size=batch_size, validate=validate):
        if require_ids:
            for name in ("prompt_ids", "response_ids"):
                if name not in batch.schema.names:
                    raise ExperienceLogError(f"{path}: column {name!r} is missing; this log holds no token ids")
                if batch.column(name).null_count:
                    row = first_index(batch.column(name).is_null().to_numpy(zero_copy_only=False))
                    raise ExperienceLogError(f"{path}: column {name!r}: null token ids in batch row {row}")
        yield from batch_to_turns(batch)


def row_to_turn(row: dict[str, Any]) -> Turn:
    """A :class:`Turn` from one log row as a plain dict (e.g. ``Table.to_pylist()``); arrival tags are in the row."""
    info = {k: row[k] for k in INFO_KEYS if row.get(k) is not None}

    def floats(values: list | None) -> np.ndarray | None:
        return None if values is None else np.array([np.nan if v is None else v for v in values], dtype=np.float32)

    return Turn(
        rollout_id=row["rollout_id"],
        turn_index=row["turn_index"],
        policy_version=row["policy_version"],
        prompt_ids=_zeros(row["prompt_len"]) if row.get("prompt_ids") is None else row["prompt_ids"],
        response_ids=_zeros(row["response_len"]) if row.get("response_ids") is None else row["response_ids"],
        action_mask=row.get("action_mask"),
        student_logprobs=floats(row.get("student_logprobs")),
        teacher_logprobs=floats(row.get("teacher_logprobs")),
        teacher_valid_mask=row.get("teacher_valid_mask"),
        prompt_truncated=row["prompt_truncated"],
        info=info,
    )
