"""The one Algorithm-1 loop (explore → enqueue, compose, update, publish, evaluate/checkpoint) over any
:class:`~divopd.train.protocol.Runtime`. A normal stop, Ctrl-C or stall ends in :func:`_finish`; a failure inside a
stage in :func:`_abort`, leaving the newest checkpoint on disk as the last good one."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from divopd.explore.explorer import Rollout
from divopd.learn.checkpoint import WeightHandle
from divopd.train.checkpoints import CheckpointWriteError, is_disk_full
from divopd.train.interrupt import StopRequest, fault_point
from divopd.train.protocol import EvalResult, Runtime
from divopd.train.trainer import Trainer
from divopd.train.watchdog import EXPLORER_TIMES, Watchdog, add_explorer_times, timed

__all__ = ["run_loop"]

log = logging.getLogger(__name__)

#: How long the loop waits for the final evaluation before giving up on it.
FINAL_EVAL_TIMEOUT_S = 600.0


class _Boundary:
    """Whether the run is at a stage boundary (no rollout taken but not queued, no batch composed but not trained and
    published): only such a state is checkpointed."""

    def __init__(self) -> None:
        self.clean = True

    @contextmanager
    def stage(self) -> Iterator[None]:
        self.clean = False
        yield
        self.clean = True


class _Evals:
    """The loop's evaluations of ``latest``: each version requested once; ``outstanding``: not recorded yet."""

    def __init__(self, trainer: Trainer, runtime: Runtime, progress: Any, latest: WeightHandle) -> None:
        self.trainer, self.runtime, self.progress, self.latest = trainer, runtime, progress, latest
        self.evaluated = {int(e["update"]) for e in trainer.state.eval_history}
        self.outstanding = 0

    def request(self) -> None:
        version = self.trainer.version
        if version not in self.evaluated:
            self.evaluated.add(version)
            self.runtime.request_eval(version, self.latest, self.trainer.snapshot_counters())
            self.outstanding += 1
            if self.runtime.evaluates_in_place:  # lockstep: done now, so recorded before the checkpoint
                self.record(self.runtime.eval_results(timeout=0))

    def record(self, results: list[EvalResult]) -> None:
        for r in results:
            self.trainer.record_eval(r.update, r.counters, r.results)
            self.outstanding -= 1
            if self.progress is not None:
                self.progress.on_eval(r.update, r.results)


def run_loop(trainer: Trainer, runtime: Runtime, *, weights: WeightHandle | None = None,
             stop: StopRequest | None = None, progress: Any = None) -> dict[str, Any]:
    """Train to ``cfg.updates`` (or ``max_seconds`` / a stop request); returns the run summary. ``weights``: the
    handle the runtime's explorers were built with (default: published now)."""
    cfg = trainer.cfg
    stop = stop or StopRequest()
    trainer.attach_runtime(runtime)  # its state goes into checkpoints; a resume restores the checkpoint's
    evals = _Evals(trainer, runtime, progress, weights if weights is not None else trainer.publish())

    fault_point("start")
    if cfg.eval.at_start and trainer.version == 0:
        evals.request()
    deadline = None if cfg.max_seconds is None else time.monotonic() + cfg.max_seconds
    interrupted = False
    at = _Boundary()
    watchdog = Watchdog(cfg.runtime.stall_timeout_s, cfg.sampler.batch_size,
                        rejected_turns_warning=cfg.runtime.rejected_turns_warning)
    watchdog.progressed(trainer.sampler.ledger.invalid_by_reason)
    stalled: str | None = None  # the watchdog's one-line reason to stop
    times = dict.fromkeys(EXPLORER_TIMES, 0.0)  # stage seconds since the previous update (time/wait_s, ...)
    try:
        while trainer.version < cfg.updates and not stop.requested:
            if deadline is not None and time.monotonic() > deadline:
                log.info("max_seconds reached at update %d", trainer.version)
                break
            # explore → enqueue (a poll cut short is no boundary)
            with at.stage():
                with timed("time/wait_s", times):
                    rollouts = runtime.poll(timeout=0)
                _intake(trainer, watchdog, rollouts, times)
            stalled = watchdog.after_intake(trainer.sampler.ledger.invalid_by_reason, trainer.version)
            if stalled is not None:
                break
            with at.stage():  # a composed batch counts its turns `selected`: no boundary until its update is out
                with timed("time/compose_s", times):
                    batch = trainer.compose()
                if batch is not None:
                    evals.record(runtime.eval_results(timeout=0))
                    trainer.count_production(runtime.producer_intervals)
                    metrics = trainer.update(batch, times)
                    fault_point("publish")
                    evals.latest = trainer.publish()
                    runtime.publish(evals.latest)
                    trainer.record_update(metrics)
            if batch is None:  # not enough valid turns yet: wait for explorers
                with timed("time/wait_s", times):
                    evals.record(runtime.eval_results(timeout=0))
                    runtime.check_alive()
                    stalled = watchdog.stalled_waiting(
                        f"the {cfg.runtime.kind} runtime's {cfg.runtime.num_explorers} explorer(s), alive by its "
                        "check_alive but silent (an environment step, generation or teacher call that does not "
                        "return?)")
                    if stalled is None:
                        with at.stage():
                            _intake(trainer, watchdog, runtime.poll(timeout=0.5), times)
                if stalled is not None:
                    break
                continue
            times = dict.fromkeys(EXPLORER_TIMES, 0.0)
            if trainer.version % cfg.eval.every == 0:
                evals.request()
            if trainer.version % cfg.checkpoint.every == 0:
                trainer.checkpoint()
            if progress is not None:
                progress.on_update(trainer, metrics)
            watchdog.progressed(trainer.sampler.ledger.invalid_by_reason)  # after the schedule: in-line evals
    except KeyboardInterrupt:  # a second Ctrl-C while a stage (or a poll) was running
        interrupted = True
        if not at.clean:
            _abort(trainer, runtime, why="was quit (Ctrl-C again)")
            raise
    except BaseException as exc:  # a crash: no final evaluation; the state is checkpointed only at a stage boundary
        disk = isinstance(exc, CheckpointWriteError) or is_disk_full(exc)  # never retry the write that failed
        _abort(trainer, runtime, checkpoint=at.clean and not disk, report=not disk)
        raise
    return _finish(trainer, runtime, evals, stop, interrupted or stop.requested, stalled)


def _finish(trainer: Trainer, runtime: Runtime, evals: _Evals, stop: StopRequest, interrupted: bool,
            stalled: str | None) -> dict[str, Any]:
    """The end of a run: explorers stop (what finished is queued), the final snapshot is evaluated unless stopped,
    then checkpoint and ``summary.json``."""
    if stalled is not None:
        log.error("%s; stopping the run at update %d: checkpointing", stalled, trainer.version)
    elif interrupted:
        log.warning("interrupted at update %d: checkpointing", trainer.version)
    aborted = interrupted or stalled is not None
    trainer.intake(runtime.shutdown(aborted))
    if not aborted:
        evals.request()  # the final snapshot
        _wait_for_evals(runtime, stop, evals)
    extra = runtime.close(aborted or stop.requested)
    evals.record(runtime.eval_results(timeout=0))
    trainer.checkpoint()
    if stalled is not None:
        extra["stalled"] = stalled
    return trainer.close({"interrupted": interrupted or stop.requested, **extra})


def _intake(trainer: Trainer, watchdog: Watchdog, rollouts: list[Rollout], times: dict[str, float]) -> None:
    trainer.intake(rollouts)
    watchdog.received(rollouts)
    add_explorer_times(rollouts, times)


def _abort(trainer: Trainer, runtime: Runtime, checkpoint: bool = False, why: str = "failed",
           report: bool = True) -> None:
    """After a failure: stop the runtime at once, queue what finished, checkpoint only when ``checkpoint`` (at a
    stage boundary). A failure while stopping is only logged. ``report=False``: no line of its own."""
    try:
        trainer.intake(runtime.shutdown(True))
        runtime.close(True)
    except Exception:  # noqa: BLE001 - the error that stopped the run is the one to report
        (log.exception if report else log.debug)("stopping the runtime after a failure failed too", exc_info=True)
        checkpoint = False  # the intake may be half done: not a boundary any more
    try:
        ckpt = trainer.abort(at_boundary=checkpoint)
        if report:
            log.error("the run %s at update %d%s; resume from %s with `divopd train --resume %s`", why,
                      trainer.version, "" if checkpoint else " inside a stage: that state is not checkpointed",
                      ckpt if ckpt is not None else "the start (no checkpoint yet)", trainer.run_dir)
    except Exception:  # noqa: BLE001 - as above
        (log.exception if report else log.debug)("closing the run after a failure failed too", exc_info=True)


def _wait_for_evals(runtime: Runtime, stop: StopRequest, evals: _Evals) -> None:
    deadline = time.monotonic() + FINAL_EVAL_TIMEOUT_S
    while evals.outstanding > 0 and runtime.evals_pending() and not stop.requested and time.monotonic() < deadline:
        evals.record(runtime.eval_results(timeout=0.5))
