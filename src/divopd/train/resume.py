"""A resume puts the checkpoint's runtime state back. Exact (lockstep): the runtime replays each running episode and
produces again the turns logged past the checkpoint, which are cut from the log. An env that cannot replay
(:class:`~divopd.explore.replay.ReplayError`): fresh explorers, those turns queued again, one warning."""

from __future__ import annotations

import logging
from typing import Any

from divopd.errors import UsageError
from divopd.explore.replay import ReplayError
from divopd.train import rundir
from divopd.train.rundir import EXPERIENCE, EXPLORER_WEIGHTS

__all__ = ["restore_runtime"]

log = logging.getLogger(__name__)


def restore_runtime(trainer: Any, runtime: Any) -> bool:
    """Put ``trainer.resume_runtime`` into ``runtime``; returns whether the resume is exact."""
    cfg, run_dir = trainer.cfg, trainer.run_dir
    if not runtime.keeps_state:
        raise UsageError(f"--resume {run_dir}: runtime.kind {cfg.runtime.kind} cannot restore the checkpoint's "
                         "runtime state (a lockstep run's)")
    state, trainer.resume_runtime = trainer.resume_runtime, None
    exact = True
    try:
        runtime.load_state_dict(state, run_dir / EXPLORER_WEIGHTS)  # replays the envs
    except ReplayError as exc:  # the runtime is left as built (fresh explorers)
        log.warning("resume: %s; resuming as the threads runtime resumes: the turns logged past the checkpoint are "
                    "queued again and the episodes running at it start over (the run is no longer exact)", exc)
        exact = False
    if cfg.log_experience:
        if exact:  # restored: it produces the turns logged past the checkpoint again
            rundir.cut_log_past_checkpoint(run_dir / EXPERIENCE, trainer.sampler.ledger.received)
        else:
            trainer.state.turns += rundir.recover_logged_turns(
                run_dir / EXPERIENCE, trainer.sampler, trainer.version, trainer.paper,
                log_token_ids=cfg.log_token_ids, needs_topk=cfg.learner.estimator == "topk")
        trainer.log_writer = rundir.log_writer(cfg, run_dir / EXPERIENCE)
    if exact:
        trainer._arrived_since_update = int(trainer.state.since_update.get("arrived") or 0)
        trainer._intervals_seen = trainer.state.since_update.get("intervals_seen")
    return exact
