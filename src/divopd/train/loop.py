"""The one Algorithm-1 loop. Every runtime (lockstep, threads, Ray) is an adapter that supplies a :class:`Runtime` to
it; :mod:`divopd.train.assemble` builds the runtime and calls :func:`run_loop` once per run.

    while learner version < updates:
        explore → enqueue    finished rollouts enter the queue tagged with the learner version at arrival
        compose              the sampler's rule picks B turns (or waits for more)
        update               one optimizer step on the batch
        publish              the new weights go to every explorer
        evaluate/checkpoint  on their schedules

Stopping: ``updates`` reached, ``max_seconds`` passed, or a :class:`~divopd.train.interrupt.StopRequest` (Ctrl-C /
SIGTERM) seen at a stage boundary. Then (1) the runtime stops its explorers and hands over every rollout that
finished but was not taken yet (it enters the ledger as queued: received, never lost); (2) the final snapshot is
evaluated (not after a stop request); (3) the trainer checkpoints; (4) ``summary.json`` is written.

Failing: an exception (or a second Ctrl-C) inside a stage — a poll, composing a batch, up to publishing its update —
stops the runtime at once, without a final evaluation, checkpoint or ``summary.json``, and re-raises: the newest
checkpoint on disk stays the last good one (its sampler state never counts an untrained batch ``selected``), and
``--resume`` trains from it again. A failure at a stage boundary (the explorers died while the loop waited)
checkpoints first.

Stalling (:mod:`divopd.train.watchdog`, ``runtime.stall_timeout_s``; 0 = off): no rollout and no completed update for
that long while the loop waits for rollouts, or a teacher that cannot score (the last 4·B turns received all without
teacher log probs), stops the run at that boundary as a stop request does (no final evaluation), with ``stalled`` —
the one-line reason, naming the stage and what it waited on — in ``summary.json``.

Stage times: every update record carries ``time/wait_s`` (in the runtime's poll and waiting for rollouts),
``time/compose_s`` (composing, failed attempts included) since the previous update, ``time/update_s``, and the
explorer seconds the rollouts that arrived since the previous update report (``time/generate_s``, ``time/env_s``,
``time/score_s``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from divopd.explore.explorer import Rollout
from divopd.learn.checkpoint import WeightHandle
from divopd.train.checkpoints import CheckpointWriteError, is_disk_full
from divopd.train.interrupt import StopRequest, fault_point
from divopd.train.trainer import Trainer
from divopd.train.watchdog import EXPLORER_TIMES, Watchdog, add_explorer_times, timed

__all__ = ["EvalResult", "Runtime", "run_loop"]

log = logging.getLogger(__name__)

#: How long the loop waits for the final evaluation before giving up on it.
FINAL_EVAL_TIMEOUT_S = 600.0


@dataclass
class EvalResult:
    """One finished evaluation: the snapshot's update, its learner counters and the eval metrics."""

    update: int
    counters: dict[str, float]
    results: dict[str, float]


class Runtime(Protocol):
    """What a runtime gives the loop: rollouts, weight publication, evaluation, shutdown — everything the loop uses.

    Implementations: :class:`~divopd.train.runtime.lockstep.LockstepRuntime`,
    :class:`~divopd.train.runtime.threads.ThreadsRuntime`, :class:`~divopd.train.runtime.ray.RayRuntime` (and an
    in-memory one in ``tests/test_loop.py``). Every method is called from the loop's thread; ``poll`` and
    ``eval_results`` must return by their ``timeout``. Optional: ``state_dict(weights_dir)`` / ``load_state_dict(state,
    weights_dir)``, a state the checkpoints hold and a resume restores (:meth:`Trainer.attach_runtime
    <divopd.train.trainer.Trainer.attach_runtime>`; the lockstep runtime's), and ``evaluates_in_place = True`` for a
    runtime whose ``request_eval`` returns with the result ready (recorded at once, before the update's checkpoint)."""

    @property
    def producer_intervals(self) -> int | None:
        """Learner-step intervals of production so far (the denominator of ``queue/producer_load``), or ``None``
        for a runtime whose production is not paced in such intervals (threads, Ray: free-running explorers)."""

    def poll(self, timeout: float) -> list[Rollout]:
        """Finished rollouts not taken yet; waits up to ``timeout`` seconds for the first one."""

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` when no explorer is left to produce rollouts."""

    def publish(self, handle: WeightHandle) -> None:
        """Make ``handle`` the weights every explorer loads before its next rollout."""

    def request_eval(self, update: int, handle: WeightHandle, counters: dict[str, float]) -> None:
        """Start evaluating the snapshot ``handle`` of learner ``update`` (results arrive in request order)."""

    def eval_results(self, timeout: float) -> list[EvalResult]:
        """Evaluations finished so far; waits up to ``timeout`` seconds for one."""

    def evals_pending(self) -> bool:
        """Whether a requested evaluation may still arrive (False once the evaluator has failed)."""

    def shutdown(self, interrupted: bool) -> list[Rollout]:
        """Stop the explorers; return the rollouts that finished but were not polled."""

    def close(self, interrupted: bool) -> dict[str, Any]:
        """Release the evaluator and everything else; return the runtime's summary fields."""


class _Evals:
    """The loop's evaluations: each learner version requested at most once (of ``latest``, the weights the explorers
    hold), results recorded in arrival order; ``outstanding`` = requested but not recorded yet."""

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
            if getattr(self.runtime, "evaluates_in_place", False):  # lockstep: done now, so before the checkpoint
                self.record(self.runtime.eval_results(timeout=0))

    def record(self, results: list[EvalResult]) -> None:
        for r in results:
            self.trainer.record_eval(r.update, r.counters, r.results)
            self.outstanding -= 1
            if self.progress is not None:
                self.progress.on_eval(r.update, r.results)


def run_loop(trainer: Trainer, runtime: Runtime, *, weights: WeightHandle | None = None,
             stop: StopRequest | None = None, progress: Any = None) -> dict[str, Any]:
    """Train to ``cfg.updates`` (or ``max_seconds`` / a stop request); returns the run summary.

    ``weights``: the handle the runtime's explorers were built with (default: published now)."""
    cfg = trainer.cfg
    stop = stop or StopRequest()
    trainer.attach_runtime(runtime)  # its state goes into checkpoints; a resume restores the checkpoint's
    evals = _Evals(trainer, runtime, progress, weights if weights is not None else trainer.publish())
    request_eval, record = evals.request, evals.record

    fault_point("start")
    if cfg.eval.at_start and trainer.version == 0:
        request_eval()
    deadline = None if cfg.max_seconds is None else time.monotonic() + cfg.max_seconds
    interrupted = False
    # True while the trainer's state is at a stage boundary (no batch composed but not yet trained and published):
    # only such a state is checkpointed, so a failure inside a stage never replaces the newest good checkpoint
    clean = True
    watchdog = _watchdog(trainer)
    stalled: str | None = None  # the watchdog's one-line reason to stop
    times = dict.fromkeys(EXPLORER_TIMES, 0.0)  # stage seconds since the previous update (time/wait_s, ...)
    try:
        while trainer.version < cfg.updates and not stop.requested:
            if deadline is not None and time.monotonic() > deadline:
                log.info("max_seconds reached at update %d", trainer.version)
                break
            # explore → enqueue: each turn is tagged with the learner version at its arrival (staleness counts
            # from the policy version that generated it, which the explorer stamped)
            clean = False  # a poll cut short (a lockstep round half done, rollouts taken but not queued) is no boundary
            with timed("time/wait_s", times):
                rollouts = runtime.poll(timeout=0)
            _intake(trainer, watchdog, rollouts, times)
            clean = True
            stalled = watchdog.after_intake(trainer.sampler.ledger.invalid_by_reason, trainer.version)
            if stalled is not None:
                break
            clean = False
            with timed("time/compose_s", times):
                batch = trainer.compose()  # a batch counts its turns `selected`: the state is dirty until published
            if batch is None:  # not enough valid turns yet: wait for explorers
                clean = True
                with timed("time/wait_s", times):
                    record(runtime.eval_results(timeout=0))
                    runtime.check_alive()
                    stalled = watchdog.stalled_waiting(_waited_on(cfg.runtime.kind, cfg.runtime.num_explorers))
                    if stalled is not None:
                        break
                    clean = False
                    rollouts = runtime.poll(timeout=0.5)
                    _intake(trainer, watchdog, rollouts, times)
                    clean = True
                continue
            record(runtime.eval_results(timeout=0))
            trainer.count_production(runtime.producer_intervals)
            metrics = trainer.update(batch, times)
            times = dict.fromkeys(EXPLORER_TIMES, 0.0)
            # publish: explorers load the new weights at their next rollout boundary, so a rollout's turns may
            # carry older versions than the learner's (the staleness the gate bounds by δ)
            fault_point("publish")
            evals.latest = trainer.publish()
            runtime.publish(evals.latest)
            clean = True
            trainer.after_update(metrics, request_eval, progress)
            watchdog.progressed(trainer.sampler.ledger.invalid_by_reason)  # after the schedule: in-line evals
    except KeyboardInterrupt:  # a second Ctrl-C while a stage (or a poll) was running
        interrupted = True
        if not clean:
            _abort(trainer, runtime, why="was quit (Ctrl-C again)")
            raise
    except BaseException as exc:  # a crash: no final evaluation; the state is checkpointed only at a stage boundary
        disk = isinstance(exc, CheckpointWriteError) or is_disk_full(exc)  # never retry the write that failed
        _abort(trainer, runtime, checkpoint=clean and not disk, report=not disk)
        raise
    interrupted = interrupted or stop.requested
    if stalled is not None:
        log.error("%s; stopping the run at update %d: checkpointing", stalled, trainer.version)
    elif interrupted:
        log.warning("interrupted at update %d: checkpointing", trainer.version)
    aborted = interrupted or stalled is not None
    trainer.intake(runtime.shutdown(aborted))  # finished rollouts enter the ledger (as queued)
    if not aborted:
        request_eval()  # the final snapshot
        _wait_for_evals(runtime, stop, evals)
    extra = runtime.close(aborted or stop.requested)
    record(runtime.eval_results(timeout=0))
    trainer.checkpoint()
    if stalled is not None:
        extra["stalled"] = stalled
    return trainer.close({"interrupted": interrupted or stop.requested, **extra})


def _watchdog(trainer: Trainer) -> Watchdog:
    """The run's stall watchdog, its gate watch counting from the ledger now."""
    runtime = trainer.cfg.runtime
    watchdog = Watchdog(runtime.stall_timeout_s, trainer.cfg.sampler.batch_size,
                        rejected_turns_warning=runtime.rejected_turns_warning)
    watchdog.progressed(trainer.sampler.ledger.invalid_by_reason)
    return watchdog


def _intake(trainer: Trainer, watchdog: Watchdog, rollouts: list[Rollout], times: dict[str, float]) -> None:
    """Finished rollouts enter the queue (and the experience log); the watchdog and the stage times see them."""
    trainer.intake(rollouts)
    watchdog.received(rollouts)
    add_explorer_times(rollouts, times)


def _waited_on(kind: str, explorers: int) -> str:
    """What the loop waits on while it waits for rollouts (for the watchdog's line)."""
    return (f"the {kind} runtime's {explorers} explorer(s), alive by its check_alive but silent (an environment "
            "step, generation or teacher call that does not return?)")


def _abort(trainer: Trainer, runtime: Runtime, checkpoint: bool = False, why: str = "failed",
           report: bool = True) -> None:
    """After a failure: stop the runtime at once (no final evaluation), keep what finished in the ledger, and
    checkpoint only when ``checkpoint`` (the state is at a stage boundary, e.g. the explorers died while the loop
    waited); else leave the newest checkpoint on disk as it is. A failure while stopping is logged: the original
    error is the one the caller sees. ``report=False``: no line of its own (a failed checkpoint write's error says
    where to resume from)."""
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
