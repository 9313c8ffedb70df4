"""The files of a directory log: listing its ``part-*.parquet`` files in order, writing a part whole or not at all
(:func:`write_part`), removing the temporary files a kill left and setting aside unreadable parts (logs written before
parts were written whole), and, on a resume from a checkpoint, truncating the log at an arrival number or logging the
turns queued again as arriving at the checkpoint's update."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from divopd.experience.log.schema import PART_PATTERN, ExperienceLogError

TMP_SUFFIX = ".tmp"  # a part being written: ``part-NNNNNN.parquet.tmp``, renamed to its name once whole


def _fsync_dir(d: Path) -> None:
    """Make a rename inside ``d`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_part(table: pa.Table, part: Path, row_group_size: int | None = None) -> None:
    """Write ``table`` as the part file ``part``, whole or not at all: written to ``<part>.tmp``, flushed to disk,
    then renamed over ``part``. A kill at any moment leaves either the previous file (or none) or the new one,
    never a part without its footer; a leftover ``.tmp`` is removed by :func:`remove_unfinished_writes`."""
    tmp = part.with_name(part.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        pq.write_table(table, f, compression="zstd", row_group_size=row_group_size)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, part)
    _fsync_dir(part.parent)


def remove_unfinished_writes(path: str | os.PathLike) -> list[Path]:
    """Delete the ``part-NNNNNN.parquet.tmp`` files of a directory log: parts a kill interrupted before they were
    renamed into the log (divopd's own temporary files; their rows were never part of the log). Returns them."""
    d = Path(path)
    if not d.is_dir():
        return []
    removed = []
    for f in sorted(d.iterdir()):
        if f.name.endswith(TMP_SUFFIX) and PART_PATTERN.match(f.name[: -len(TMP_SUFFIX)]) and f.is_file():
            f.unlink()
            removed.append(f)
    return removed


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
    """Rename the part files of a directory log that cannot be opened to ``<name>.unreadable``, so readers and
    appending writers leave them out; returns the new paths. Parts written by :func:`write_part` are whole, so a log
    written since then has none; a log written before (a part streamed open until it was full, killed before its
    footer) may, and a part damaged by other means (disk, a hand edit) is set aside the same way."""
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
        _replace_part(part, pq.read_table(part).filter(pa.array(keep)))
    return dropped


def requeue_at_update(path: str | os.PathLike, first_arrival: int, update: int) -> int:
    """Log the rows with ``arrival >= first_arrival`` as entering the queue at learner update ``update`` at most (their
    ``arrival_update`` is lowered to ``update``); returns the rows changed.

    On a resume from a checkpoint at update ``update``, the turns logged after the checkpoint are queued again before
    the resumed run's first step: in the resumed run they entered the queue at ``update``, not at the later update of
    the lost session, and the resumed run's new turns (logged at ``update`` and on) must not precede them.
    """
    d = Path(path)
    if not d.is_dir():
        raise ExperienceLogError(f"{d}: requeue_at_update works on a directory of part files")
    changed = 0
    for part in sorted(f for f in d.iterdir() if PART_PATTERN.match(f.name)):
        cols = pq.read_table(part, columns=["arrival", "arrival_update"])
        arrivals = cols.column("arrival").to_numpy()
        updates = cols.column("arrival_update").to_numpy()
        late = (arrivals >= first_arrival) & (updates > update)
        if not late.any():
            continue
        changed += int(late.sum())
        table = pq.read_table(part)
        i = table.schema.get_field_index("arrival_update")
        _replace_part(part, table.set_column(i, table.schema.field(i),
                                             pa.array(np.where(late, update, updates), type=pa.int64())))
    return changed


def _replace_part(part: Path, table: pa.Table) -> None:
    """Rewrite one part file with ``table`` (:func:`write_part`), so a crash leaves one or the other whole."""
    write_part(table, part)
