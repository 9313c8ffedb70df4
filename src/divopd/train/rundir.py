"""What a run directory holds, how divopd recognises one as its own, and removing what a run wrote.

divopd writes, overwrites and deletes only inside a directory it made a run: a fresh run marks its directory with
:data:`MARKER` (``.divopd-run``) when it creates or claims it (a new or empty folder). A directory written by an older
divopd, without the marker, is recognised by divopd's own layout: a ``config.yaml`` beside a ``metrics.jsonl``. Any
other non-empty folder is refused with one line (:func:`claim_run_dir`, :func:`check_is_run`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from divopd.errors import RunExistsError, UsageError

CHECKPOINTS = "checkpoints"
EXPERIENCE = "experience"
#: The marker file a fresh run writes into the directory it creates or claims.
MARKER = ".divopd-run"
#: Everything a run writes into its directory: the resolved config, metrics, summary, TensorBoard events, the
#: experience log, the checkpoints and the marker.
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "summary.json", "tb", EXPERIENCE, CHECKPOINTS, MARKER)


def is_run_dir(path: Path) -> bool:
    """``path`` is a divopd run directory: it holds :data:`MARKER`, or (a run of an older divopd) both
    ``config.yaml`` and ``metrics.jsonl``."""
    path = Path(path)
    return (path / MARKER).is_file() or ((path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file())


def check_is_run(path: Path, flag: str = "--resume") -> None:
    """Raise :class:`~divopd.errors.UsageError` unless ``path`` is a divopd run directory."""
    if not is_run_dir(path):
        raise UsageError(f"{flag} {path}: not a divopd run directory (no {MARKER}, no config.yaml with "
                         "metrics.jsonl); divopd changes nothing there")


def claim_run_dir(run_dir: Path) -> list[str] | None:
    """Make ``run_dir`` the directory of a fresh run, before anything is written into it; returns the names of the
    entries it held before, ``None`` when this call created it (a fresh run that is discarded removes only what it
    wrote, :func:`remove_run_files`).

    A missing or empty directory is created and marked; a run directory that already holds a run (its
    ``metrics.jsonl``) raises :class:`~divopd.errors.RunExistsError`; any other non-empty folder raises
    :class:`~divopd.errors.UsageError`: divopd never writes into a folder it did not make a run."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir}: exists and is not a directory")
    existed = run_dir.is_dir()
    before = sorted(p.name for p in run_dir.iterdir()) if existed else []
    if before and (run_dir / "metrics.jsonl").is_file() and is_run_dir(run_dir):
        raise RunExistsError(f"{run_dir} already holds a run; pass --resume {run_dir} to continue it, or choose "
                             "another seed or --run-dir")
    if before and not is_run_dir(run_dir):
        raise UsageError(f"--run-dir {run_dir}: the folder holds files and is not a divopd run directory (no "
                         f"{MARKER}); choose a new or empty folder: divopd writes only into run directories it made")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MARKER).write_text("divopd run directory: divopd may write, replace and delete its run files here\n")
    return before if existed else None


def remove_run_files(run_dir: Path, names: Iterable[str] = RUN_ENTRIES, keep: Iterable[str] = ()) -> None:
    """Remove the entries ``names`` (files or folders) of ``run_dir`` except those in ``keep`` (what the directory
    held before this invocation); missing ones are skipped, nothing else in the directory is touched."""
    kept = set(keep)
    for name in names:
        if name in kept:
            continue
        path = Path(run_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
