"""The part files of a directory log: listed in numeric order, each written whole or not at all, compacted per
checkpoint interval, cut or extended on a resume. A part inside a compacted part's range is *covered*: readers leave
it out and the next writer removes it, so a kill at any moment leaves every row in exactly one place."""

from __future__ import annotations

import contextlib
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
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)


def _log_dir(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a directory log; :class:`ExperienceLogError` naming ``what`` when it is not a directory."""
    d = Path(path)
    if not d.is_dir():
        raise ExperienceLogError(f"{d}: {what} works on a directory of part files")
    return d


def write_part(table: pa.Table, part: Path, row_group_size: int | None = None) -> None:
    """Write ``table`` as the part file ``part``, whole or not at all (written to ``<part>.tmp``, flushed, renamed)."""
    tmp = part.with_name(part.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        pq.write_table(table, f, compression="zstd", row_group_size=row_group_size)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, part)
    _fsync_dir(part.parent)


def remove_unfinished_writes(path: str | os.PathLike) -> list[Path]:
    """Delete (and return) the ``part-*.parquet.tmp`` files a kill left in a directory log (never part of the log)."""
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
    """The part files of a directory log in numeric order (``part-1000000`` after ``part-999999``), not covered."""
    return _split_covered(Path(path))[0]


def next_part_number(path: str | os.PathLike) -> int:
    """The number a new part of the directory log takes: one past the highest in use."""
    return max((last for (_, last), _ in _all_parts(Path(path))), default=-1) + 1


def remove_covered_parts(path: str | os.PathLike) -> list[Path]:
    """Delete (and return) the covered parts: inputs of a finished compaction a kill left on disk."""
    d = Path(path)
    if not d.is_dir():
        return []
    covered = _split_covered(d)[1]
    for f in covered:
        f.unlink()
    return covered


def compact_parts(path: str | os.PathLike, row_group_size: int = 8192, min_parts: int = 2) -> Path | None:
    """Merge the ``part-N`` files after the newest ``part-A-B`` into one ``part-A-B.parquet``, whole or not at all, and
    return it; ``None`` (nothing merged) when fewer than ``min_parts`` would merge or their columns differ."""
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
    """Test hook: SIGKILL here when ``DIVOPD_SIGKILL_AT`` is ``compact-write`` (not renamed) or ``compact-remove``."""
    if os.environ.get("DIVOPD_SIGKILL_AT", "").split(":")[0] == phase:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def log_files(path: str | os.PathLike) -> list[Path]:
    """The Parquet files of a log: ``path`` itself, or a directory's :func:`part_files`."""
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
    """Rename the part files of a directory log that cannot be opened (killed before their footer, damaged) to
    ``<name>.unreadable``, so readers and writers leave them out; returns the new paths."""
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
    """The arrival numbers under ``below`` (``None``: the last logged one) that no part of the directory log holds, as
    ``(first, last)`` ranges: a training run logs arrivals 0, 1, 2, ... without a gap."""
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
    """Drop (and count) the rows with ``arrival >= first_dropped_arrival``; unreadable parts are set aside first."""
    d = _log_dir(path, "truncate_log")
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
        write_part(pq.read_table(part).filter(pa.array(keep)), part)
    return dropped


def first_arrival_at_update(path: str | os.PathLike, update: int) -> int | None:
    """The arrival number of the first row of a directory log with ``arrival_update >= update`` (``None``: none):
    where :func:`truncate_log` cuts a log back to a checkpoint known by its update."""
    for part in part_files(_log_dir(path, "first_arrival_at_update")):
        cols = pq.read_table(part, columns=["arrival", "arrival_update"])
        late = np.flatnonzero(cols.column("arrival_update").to_numpy() >= update)
        if len(late):
            return int(cols.column("arrival").to_numpy()[late[0]])
    return None


def requeue_at_update(path: str | os.PathLike, first_arrival: int, update: int) -> int:
    """Lower the ``arrival_update`` of the rows with ``arrival >= first_arrival`` to at most ``update``; returns the
    rows changed. A resume from the checkpoint at ``update`` queues those turns again before its first step."""
    d = _log_dir(path, "requeue_at_update")
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
        write_part(table.set_column(i, table.schema.field(i),
                                    pa.array(np.where(late, update, updates), type=pa.int64())), part)
    return changed
