"""Task files for Trinity-RFT's taskset (``buffer.explorer_input.taskset``), written by ``divopd tasks --for trinity``.

One JSON object per line, one file per split in one folder; the dict-valued fields as JSON *text* (Arrow would merge
dicts of different shapes into one struct type). This module imports no framework.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from divopd.errors import UsageError
from divopd.integrations.verl_tasks import ROW_KEYS, check_row

__all__ = ["JSON_FIELDS", "ROW_KEYS", "read_row", "write_tasks"]

#: Row fields holding a dict, written as JSON text.
JSON_FIELDS = ("env_kwargs", "explorer")


def write_tasks(rows: list[dict], out: Path) -> None:
    """Write ``rows`` as JSON lines to ``out`` (a ``.jsonl`` file; written whole or not at all)."""
    out = Path(out)
    if out.suffix != ".jsonl":
        raise UsageError(f"--out {out}: a Trinity taskset file ends in .jsonl (name it after its split: "
                         "train.jsonl, test.jsonl)")
    for row in rows:
        check_row(row)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            for row in rows:
                line = {k: (json.dumps(v, sort_keys=True) if k in JSON_FIELDS else v) for k, v in row.items()}
                f.write(json.dumps(line, sort_keys=True) + "\n")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def read_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A task row as :func:`write_tasks` wrote it (its JSON-text fields decoded); a dict given as a dict is kept."""
    row = dict(raw)
    for key in JSON_FIELDS:
        value = row.get(key)
        if isinstance(value, str):
            try:
                row[key] = json.loads(value)
            except json.JSONDecodeError:
                raise UsageError(f"task row {row.get('index')!r}: {key} is not JSON ({value[:80]!r})") from None
        elif value is None:
            row.pop(key, None)
    return row
