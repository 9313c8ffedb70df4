"""What a run directory holds, and removing it again (a fresh run that failed on bad input, a resume that finds no
checkpoint and starts over)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

CHECKPOINTS = "checkpoints"
EXPERIENCE = "experience"
#: Everything a run writes into its directory: the resolved config, metrics, summary, TensorBoard events, the
#: experience log and the checkpoints.
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "summary.json", "tb", EXPERIENCE, CHECKPOINTS)


def remove_run_files(run_dir: Path, names: Iterable[str] = RUN_ENTRIES) -> None:
    """Remove the entries ``names`` (files or folders) of ``run_dir``; missing ones are skipped, nothing else in the
    directory is touched."""
    for name in names:
        path = Path(run_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
