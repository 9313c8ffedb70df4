"""The part files of a directory log: listed in numeric order (:func:`part_files`), each written whole or not at all
(:func:`write_part`), compacted per checkpoint interval (:func:`compact_parts`), and cut or extended on a resume.

Compaction is whole or not at all: parts ``A..B`` are streamed into ``part-A-B.parquet.tmp``, flushed and renamed;
only then are the inputs removed. An input inside a compacted part's range is *covered*: readers leave it out and the
next writer removes it (:func:`remove_covered_parts`), so a kill at any moment leaves the rows either in the inputs or
in the merged file, never in both and never in neither.
"""

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


def part_span(name: str) -> tuple[int, int]:
    """The part numbers a part file holds: ``(N, N)`` for ``part-N.parquet``, ``(A, B)`` for ``part-A-B.parquet``."""
    m = PART_PATTERN.match(name)
    if m is None:
        raise ValueError(f"{name}: not a part file name")
    return int(m.group(1)), int(m.group(2) or m.group(1))


def _all_parts(d: Path) -> list[tuple[tuple[int, int], Path]]:
    return sorted(((part_span(f.name), f) for f in d.iterdir() if PART_PATTERN.match(f.name)),
                  key=lambda x: (x[0][0], -x[0][1]))


def _split_covered(d: Path) -> tuple[list[Path], list[Path]]:
    """(the parts of the log in order, the parts covered by a compacted part's range)."""
    live: list[Path] = []
    covered: list[Path] = []
    end = -1
    for (_, last), f in _all_parts(d):
        if last <= end:  # inside the range of a compacted part before it (sorted by first, widest first)
            covered.append(f)
        else:
            live.append(f)
            end = last
    return live, covered


def part_files(path: str | os.PathLike) -> list[Path]:
    """The part files of a directory log in numeric order (``part-1000000`` after ``part-999999``), leaving out the
    inputs of a compaction that a kill stopped before it removed them (their rows are in the compacted part)."""
    return _split_covered(Path(path))[0]


def next_part_number(path: str | os.PathLike) -> int:
    """The number a new part of the directory log takes: one past the highest in use."""
    spans = [span for span, _ in _all_parts(Path(path))]
    return max((last for _, last in spans), default=-1) + 1


def remove_covered_parts(path: str | os.PathLike) -> list[Path]:
    """Delete the inputs of a finished compaction still on disk (a kill after the compacted part was renamed into
    place, before its inputs were removed); returns them. Only divopd's own part names are touched."""
    d = Path(path)
    if not d.is_dir():
        return []
    covered = _split_covered(d)[1]
    for f in covered:
        f.unlink()
    return covered


def compact_parts(path: str | os.PathLike, row_group_size: int = 8192, min_parts: int = 2) -> Path | None:
    """Merge the parts written since the last compaction (the trailing ``part-N`` files after the newest
    ``part-A-B``) into one ``part-A-B.parquet``, whole or not at all: streamed into a ``.tmp`` file, flushed and
    renamed before the inputs are removed, so a kill leaves every row in exactly one place. Returns the merged file,
    or ``None`` when fewer than ``min_parts`` would merge or their columns differ (left as they are)."""
    d = Path(path)
    if not d.is_dir():
        return None
    remove_covered_parts(d)
    tail: list[tuple[tuple[int, int], Path]] = []
    for span, f in _all_parts(d):
        tail = [] if span[0] != span[1] else [*tail, (span, f)]
    if len(tail) < min_parts:
        return None
    schemas = [pq.read_schema(f) for _, f in tail]
    if any(not sc.equals(schemas[0]) for sc in schemas[1:]):
        return None
    target = d / f"part-{tail[0][0][0]:06d}-{tail[-1][0][1]:06d}.parquet"
    tmp = target.with_name(target.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as fh:
            with pq.ParquetWriter(fh, schemas[0], compression="zstd") as writer:
                pending: list[pa.Table] = []  # whole row groups of row_group_size rows, not one per input part
                for i, (_, f) in enumerate(tail):
                    pending.append(pq.read_table(f, schema=schemas[0]))
                    if sum(t.num_rows for t in pending) >= row_group_size or i == len(tail) - 1:
                        writer.write_table(pa.concat_tables(pending), row_group_size=row_group_size)
                        pending = []
            fh.flush()
            os.fsync(fh.fileno())
        _kill_point("compact-write")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(d)
    _kill_point("compact-remove")
    for _, f in tail:  # covered from here on: a kill now leaves them to remove_covered_parts
        f.unlink()
    _fsync_dir(d)
    return target


def _kill_point(phase: str) -> None:
    """Test hook of a compaction's two steps, ``DIVOPD_SIGKILL_AT=compact-write`` (merged file written, not renamed)
    or ``compact-remove`` (renamed, inputs not removed): SIGKILL this process there (the experience log cannot
    import :func:`divopd.train.interrupt.fault_point`, whose variable it shares)."""
    if os.environ.get("DIVOPD_SIGKILL_AT", "").split(":")[0] == phase:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def log_files(path: str | os.PathLike) -> list[Path]:
    """The Parquet files of a log: ``path`` itself, or a directory's part files in numeric order
    (:func:`part_files`)."""
    p = Path(path)
    if p.is_dir():
        parts = part_files(p)
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
    remove_covered_parts(d)
    for part in part_files(d):
        try:
            pq.ParquetFile(part)
        except (pa.ArrowInvalid, OSError):
            target = part.with_name(part.name + ".unreadable")
            part.rename(target)
            moved.append(target)
    return moved


def missing_arrivals(path: str | os.PathLike, below: int | None) -> list[tuple[int, int]]:
    """The arrival numbers under ``below`` that no part of the directory log holds, as ``(first, last)`` ranges (the
    turns of parts set aside as unreadable: a training run logs arrivals 0, 1, 2, ... without a gap); ``None``: the
    gaps up to the last logged arrival."""
    gaps, expected = [], 0
    for part in part_files(path):
        arrivals = pq.read_table(part, columns=["arrival"]).column("arrival").to_numpy()
        a = arrivals if below is None else arrivals[arrivals < below]
        if not len(a):
            continue
        starts = np.concatenate(([expected], a[:-1] + 1))
        jump = a > starts
        gaps += [(int(s), int(e) - 1) for s, e in zip(starts[jump], a[jump], strict=True)]
        expected = int(a[-1]) + 1
    if below is not None and expected < below:
        gaps.append((expected, below - 1))
    return gaps


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
    for part in part_files(d):
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


def first_arrival_at_update(path: str | os.PathLike, update: int) -> int | None:
    """The arrival number of the first row of a directory log logged at learner update ``update`` or later
    (``arrival_update >= update``), ``None`` when there is none: where :func:`truncate_log` cuts a log back to a
    checkpoint known by its update (a framework plug-in resumed from its framework's checkpoint of that step)."""
    d = Path(path)
    if not d.is_dir():
        raise ExperienceLogError(f"{d}: first_arrival_at_update works on a directory of part files")
    for part in part_files(d):
        cols = pq.read_table(part, columns=["arrival", "arrival_update"])
        late = np.flatnonzero(cols.column("arrival_update").to_numpy() >= update)
        if len(late):
            return int(cols.column("arrival").to_numpy()[late[0]])
    return None


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
    remove_covered_parts(d)
    changed = 0
    for part in part_files(d):
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
