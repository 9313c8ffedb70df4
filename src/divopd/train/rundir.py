"""A run directory: opening it fresh or for a resume, recognising divopd's own, removing what a run wrote, and the
experience log past the checkpoint a resume starts from. divopd writes only inside a directory it made a run."""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from divopd.errors import RunExistsError, UsageError
from divopd.experience.log import (
    ExperienceLogError,
    ExperienceLogWriter,
    log_files,
    read_log,
    requeue_at_update,
    set_aside_unreadable_parts,
    truncate_log,
)
from divopd.experience.log.parts import missing_arrivals
from divopd.learn.checkpoint import atomic_write_text, checkpoint_dirs, read_state, remove_interrupted_writes
from divopd.sampling import Sampler
from divopd.sampling.paper_diagnostics import RunDiagnostics
from divopd.train.checkpoints import resume_checkpoint, unused_path
from divopd.train.config import TrainConfig, dump_config, load_config
from divopd.train.runlock import LOCK, run_lock

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
EXPERIENCE = "experience"
#: The lockstep runtime's explorer weights that a checkpoint's runtime state names (:func:`prune_explorer_weights`).
EXPLORER_WEIGHTS = "explorer-weights"
#: The marker file a fresh run writes into the directory it creates or claims.
MARKER = ".divopd-run"
#: The run files a fresh run moves aside from a run directory that holds no checkpoint.
STRANDED_ENTRIES = ("config.yaml", "metrics.jsonl", "summary.json", "tb", EXPERIENCE, CHECKPOINTS, EXPLORER_WEIGHTS)
#: Everything a run writes into its directory: its run files, the marker and the lock of the process writing it.
RUN_ENTRIES = (*STRANDED_ENTRIES, MARKER, LOCK)
#: The folder (a UTC time appended) those files go to, inside the run directory: nothing is deleted.
STRANDED_PREFIX = "stranded-"


@dataclass
class OpenedRunDir:
    """A run directory opened for a run. ``checkpoint``: where a resume starts (``None``: fresh); ``preexisting``:
    the entries it held before a fresh run claimed it (``None``: the run created it); ``held``: its lock."""

    path: Path
    cfg: TrainConfig
    checkpoint: Path | None
    resumed: bool
    preexisting: tuple[str, ...] | None
    held: ExitStack


def open_run_dir(cfg: TrainConfig | None, resume: str | Path | None) -> OpenedRunDir:
    """Claim a fresh run's directory, or reopen ``resume`` (its config unless ``cfg`` is given) at its newest
    checkpoint that verifies; writes ``config.yaml``. The result holds the lock, taken before anything is touched."""
    held = ExitStack()
    with held:
        if resume is not None:
            run_dir = Path(resume)
            if not (run_dir / "config.yaml").is_file():
                raise FileNotFoundError(f"--resume {run_dir}: no config.yaml there; is it a divopd run directory?")
            check_is_run(run_dir)
            held.enter_context(run_lock(run_dir))
            cfg = load_config(run_dir / "config.yaml") if cfg is None else cfg
            for line in remove_interrupted_writes(run_dir / CHECKPOINTS):
                log.warning("resume: %s", line)
        if cfg is None:
            raise ValueError("open_run needs a config or a run directory to resume")
        run_dir = Path(resume) if resume is not None else cfg.resolved_run_dir()
        ckpt = resume_checkpoint(run_dir)  # the newest that verifies; damaged newer ones set aside, one warning
        if resume is not None and ckpt is None:  # nothing to restore: refuse, and delete nothing
            raise UsageError(f"--resume {run_dir}: no checkpoint there, nothing to resume from (the run stopped "
                             f"before its first checkpoint); start it afresh with `divopd train {run_dir}/config.yaml "
                             f"--run-dir {run_dir}`: its old files are kept in {run_dir}/stranded-<time>/")
        before = [] if resume is not None else claim_run_dir(run_dir, held)
        atomic_write_text(run_dir / "config.yaml", dump_config(cfg))
        return OpenedRunDir(run_dir, cfg, ckpt, resume is not None, None if before is None else tuple(before),
                            held.pop_all())


def is_run_dir(path: Path) -> bool:
    """``path`` holds :data:`MARKER`, or (an older divopd's run) both ``config.yaml`` and ``metrics.jsonl``."""
    path = Path(path)
    return (path / MARKER).is_file() or ((path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file())


def check_is_run(path: Path, flag: str = "--resume") -> None:
    """Raise :class:`~divopd.errors.UsageError` unless ``path`` is a divopd run directory."""
    if not is_run_dir(path):
        raise UsageError(f"{flag} {path}: not a divopd run directory (no {MARKER}, no config.yaml with "
                         "metrics.jsonl); divopd changes nothing there")


def _entries(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name != LOCK) if run_dir.is_dir() else []


def claim_run_dir(run_dir: Path, held: ExitStack) -> list[str] | None:
    """Make ``run_dir`` a fresh run's directory (created, locked on ``held``, marked; a stranded run moved aside)
    unless :func:`fresh_run_refusal` refuses; returns the entries it held before, ``None`` when it created it."""
    run_dir = Path(run_dir)
    refusal = fresh_run_refusal(run_dir)
    if refusal is not None:
        raise refusal
    existed = run_dir.is_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    held.enter_context(run_lock(run_dir))  # before anything is written: two fresh runs never both see an empty one
    refusal = fresh_run_refusal(run_dir)  # another process may have made it a run meanwhile
    if refusal is not None:
        raise refusal
    if _entries(run_dir) and is_run_dir(run_dir):
        aside = set_aside_stranded_run(run_dir)
        if aside is not None:
            log.warning("%s held a run that stopped before its first checkpoint; its files are kept in %s; starting "
                        "a fresh run there", run_dir, aside)
    before = _entries(run_dir)
    (run_dir / MARKER).write_text("divopd run directory: divopd may write, replace and delete its run files here\n")
    return before if existed else None


def fresh_run_refusal(run_dir: Path) -> UsageError | None:
    """Why a fresh run may not use ``run_dir`` (``None``: it may): a file, a folder divopd did not make a run, or a
    run holding a checkpoint (:class:`~divopd.errors.RunExistsError`)."""
    if run_dir.exists() and not run_dir.is_dir():
        return UsageError(f"--run-dir {run_dir}: exists and is not a directory")
    if _entries(run_dir) and not is_run_dir(run_dir):
        return UsageError(f"--run-dir {run_dir}: the folder holds files and is not a divopd run directory (no "
                          f"{MARKER}); choose a new or empty folder: divopd writes only into run directories it made")
    if _entries(run_dir) and has_checkpoint(run_dir):
        return RunExistsError(f"{run_dir} already holds a run; pass --resume {run_dir} to continue it, or choose "
                              "another seed or --run-dir")
    return None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a ``checkpoints/update-*`` with its ``state.json``."""
    folder = Path(run_dir) / CHECKPOINTS
    return folder.is_dir() and any((p / "state.json").is_file() for p in folder.glob("update-*"))


def set_aside_stranded_run(run_dir: Path) -> Path | None:
    """Move :data:`STRANDED_ENTRIES` into a new ``stranded-<UTC time>`` folder inside ``run_dir``; returns it
    (``None``: nothing to move). Nothing is deleted."""
    run_dir = Path(run_dir)
    names = [n for n in STRANDED_ENTRIES if (run_dir / n).exists() or (run_dir / n).is_symlink()]
    if not names:
        return None
    aside = unused_path(run_dir / f"{STRANDED_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    aside.mkdir()
    for name in names:
        (run_dir / name).rename(aside / name)
    return aside


def remove_run_files(run_dir: Path, names: Iterable[str] = RUN_ENTRIES, keep: Iterable[str] = ()) -> None:
    """Remove the entries ``names`` of ``run_dir`` but those in ``keep``; nothing else is touched."""
    kept = set(keep)
    for name in [n for n in names if n not in kept]:
        path = Path(run_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def requeue_logged_turns(log_dir: Path, sampler: Sampler, version: int, paper: RunDiagnostics,
                         needs_topk: bool = False) -> int:
    """Queue again (counted received by ``paper``) the turns logged past the checkpoint, then logged as arriving at
    update ``version``; returns how many. ``needs_topk``: the log holds no teacher top-k, so each enters unscored
    (the gate counts it ``missing_teacher``) instead of training with another loss."""
    start = sampler.ledger.received  # arrivals are numbered 0, 1, ...
    gaps = missing_arrivals(log_dir, None) if Path(log_dir).is_dir() else []
    gap = next((max(a, start) for a, b in gaps if b >= start), None)
    if gap is not None:  # an unreadable part past the checkpoint: what follows it cannot keep its arrival numbers
        dropped = truncate_log(log_dir, gap)
        log.warning("resume: %d turns logged past the checkpoint after an unreadable part (arrival %d on) cannot be "
                    "queued again in order; removed from the log", dropped, gap)
    try:
        files = log_files(log_dir)
    except ExperienceLogError:
        return 0
    requeue_at_update(log_dir, start, version)  # rewrites parts in place: the same files
    n = unscored = 0
    for f in files:
        arrivals = pq.read_table(f, columns=["arrival"]).column("arrival").to_numpy()
        if len(arrivals) == 0 or arrivals.max() < start:
            continue  # every turn of this part is in the checkpoint already
        for logged in read_log(f, require_ids=True):
            if logged.arrival < start:
                continue
            turn = logged.turn
            if needs_topk and turn.teacher_topk_logprobs is None:
                turn = dataclasses.replace(turn, teacher_logprobs=None, teacher_valid_mask=None)
                unscored += 1
            (arrival,) = sampler.add([turn])
            paper.observe_received([logged.turn])
            if arrival != logged.arrival:
                raise RuntimeError(f"resume: log arrival {logged.arrival} does not follow the checkpoint ({arrival})")
            n += 1
    if unscored:
        log.warning("resume: %d re-queued turns have no teacher top-k in the log (learner.estimator topk); the gate "
                    "counts them invalid (missing_teacher)", unscored)
    return n


def recover_logged_turns(log_dir: Path, sampler: Sampler, version: int, paper: RunDiagnostics, *,
                         log_token_ids: bool, needs_topk: bool) -> int:
    """A resume without runtime state: :func:`requeue_logged_turns`, or without logged token ids, cut those turns
    from the log (with a warning); returns how many were queued."""
    if log_token_ids:
        requeued = requeue_logged_turns(log_dir, sampler, version, paper, needs_topk=needs_topk)
        if requeued:
            log.info("resume: %d logged turns past the checkpoint queued again", requeued)
        return requeued
    dropped = truncate_log(log_dir, sampler.ledger.received) if Path(log_dir).is_dir() else 0
    if dropped:
        log.warning("resume: %d turns logged after the checkpoint were never received by the restored sampler "
                    "(log_token_ids is off, so they cannot be queued again); removed from the log", dropped)
    return 0


def open_log(cfg: Any, log_dir: Path, sampler: Sampler, state: Any, version: int | None, exact: bool
             ) -> ExperienceLogWriter | None:
    """The run's experience log at a start: unreadable parts set aside (counted in ``state.log_unreadable``), then
    :func:`recover_logged_turns` unless fresh or ``exact``; returns the writer (``None`` when ``exact``)."""
    moved = set_aside_unreadable_parts(log_dir)
    received = sampler.ledger.received
    gaps = missing_arrivals(log_dir, received) if moved and received else []
    lost = sum(b - a + 1 for a, b in gaps)
    for part in moved:
        log.warning("experience log: set aside unreadable part %s%s", part.name,
                    f"; {lost} received turn(s) left the log (summary.json log/unreadable_turns)" if lost else "")
    if lost:
        state.log_unreadable = {"turns": state.log_unreadable["turns"] + lost,
                                "parts": [*state.log_unreadable["parts"], *(p.name for p in moved)],
                                "arrivals": [*state.log_unreadable.get("arrivals", []), *map(list, gaps)]}
    if version is not None and not exact:
        state.turns += recover_logged_turns(log_dir, sampler, version, RunDiagnostics(state.diagnostics),
                                            log_token_ids=cfg.log_token_ids,
                                            needs_topk=cfg.learner.estimator == "topk")
    return None if exact else log_writer(cfg, log_dir)


def log_writer(cfg: TrainConfig, log_dir: Path) -> ExperienceLogWriter:
    return ExperienceLogWriter(log_dir, rows_per_file=1 << 16, write_ids=cfg.log_token_ids)


def cut_log_past_checkpoint(log_dir: Path, received: int) -> int:
    """An exact resume: cut the turns logged past the checkpoint, which the runtime produces again."""
    if not Path(log_dir).is_dir():
        return 0
    dropped = truncate_log(log_dir, received)
    if dropped:
        log.info("resume: %d turns logged after the checkpoint removed from the log; the restored lockstep runtime "
                 "produces them again", dropped)
    return dropped


def runtime_weight_files(runtime_state: dict[str, Any] | None) -> set[str]:
    """The explorer weight files (in :data:`EXPLORER_WEIGHTS`) a checkpoint's runtime state names."""
    explorers = (runtime_state or {}).get("explorers", [])
    return {str(e["weights_file"]) for e in explorers if isinstance(e, dict) and e.get("weights_file")}


def prune_explorer_weights(run_dir: Path, checkpoints: Iterable[Path] | None = None) -> list[str]:
    """Remove divopd's files in :data:`EXPLORER_WEIGHTS` that none of ``checkpoints`` (default: all) names, so one
    session's file is never taken for another's same version; returns their names."""
    folder = Path(run_dir) / EXPLORER_WEIGHTS
    if not folder.is_dir():
        return []
    if checkpoints is None:
        checkpoints = checkpoint_dirs(Path(run_dir) / CHECKPOINTS)
    named: set[str] = set()
    for ckpt in checkpoints:
        try:
            state = read_state(ckpt)
        except (OSError, ValueError):  # a damaged checkpoint names nothing a resume could use
            continue
        named |= runtime_weight_files(state.get("extra_state", {}).get("runtime"))
    removed = []
    for f in sorted(folder.iterdir()):
        ours = _WEIGHTS_FILE.fullmatch(f.name) or _WEIGHTS_TMP.fullmatch(f.name)
        if ours and f.is_file() and f.name not in named:
            f.unlink()
            removed.append(f.name)
    return removed


_WEIGHTS_FILE = re.compile(r"explorer-v\d+\.safetensors")
_WEIGHTS_TMP = re.compile(r"\.explorer-v\d+\.safetensors\.tmp")
