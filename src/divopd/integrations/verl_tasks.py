"""verl's dataset files (``data.train_files`` / ``data.val_files``), written by ``divopd tasks CONFIG --for verl``.

One parquet row per task, naming divopd's agent loop (``agent_name``) and carrying divopd's task row as JSON *text* in
``extra_info.divopd_task`` (Arrow would merge dicts of different shapes into one struct type). The ``prompt`` column
only names the task: the loop builds the real prompts from the environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from divopd.errors import UsageError

__all__ = ["AGENT_NAME", "ROW_KEYS", "check_row", "verl_row", "write_tasks"]

#: The name divopd's agent loop is registered under in verl (:mod:`divopd.integrations.verl_env_agent`).
AGENT_NAME = "divopd_env_agent"

#: The keys every divopd task row has (``divopd.commands.tasks.task_rows``).
ROW_KEYS = ("env", "env_kwargs", "split", "task", "index", "max_steps")


def check_row(row: dict[str, Any]) -> None:
    """One :class:`UsageError` line naming the first of :data:`ROW_KEYS` that ``row`` lacks."""
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise UsageError(f"task row {row.get('index')!r} has no {missing[0]!r}")


def verl_row(row: dict[str, Any]) -> dict[str, Any]:
    """The verl dataset row of one divopd task row."""
    check_row(row)
    return {
        "data_source": f"divopd/{row['env']}",
        "agent_name": AGENT_NAME,
        "prompt": [{"role": "user", "content": f"divopd task {row['task']} of environment {row['env']}"}],
        "ability": "agent",
        "reward_model": {"style": "divopd_env", "ground_truth": ""},
        "extra_info": {"index": int(row["index"]), "split": str(row["split"]),
                       "divopd_task": json.dumps(row, sort_keys=True)},
    }


def write_tasks(rows: list[dict], out: Path) -> None:
    """Write ``rows`` as verl dataset rows to ``out`` (a ``.parquet`` file; written whole or not at all)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    if out.suffix != ".parquet":
        raise UsageError(f"--out {out}: verl's dataset files are parquet (name it train.parquet / val.parquet)")
    table = pa.Table.from_pylist([verl_row(r) for r in rows])
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
