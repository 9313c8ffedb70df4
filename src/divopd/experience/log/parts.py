"""The files of a directory log: listing its ``part-*.parquet`` files in order, setting aside parts a crash left
unreadable, and truncating the log at an arrival number (resuming from a checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from divopd.experience.log.schema import PART_PATTERN, ExperienceLogError


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
