"""The learner side of asynchronous OPD, free of any runtime: queue intake → sampler → one update per batch.

The one loop (:func:`divopd.train.loop.run_loop`) calls this class; runtimes only own the explorers:

1. :meth:`Trainer.intake` — finished rollouts enter the sampler's queue in arrival order, tagged with the learner
   version at arrival, and are appended to the experience log (the log is the write-ahead record used on resume);
2. :meth:`Trainer.compose` asks the sampler for a batch at the current learner version; with one,
   :meth:`Trainer.update` makes the learner take exactly one optimizer step and writes the update's metrics;
3. :meth:`Trainer.checkpoint` — learner + sampler state + counters, atomically; the experience log part is closed so
   everything logged so far stays readable after a crash (the loop calls it only at a stage boundary, else
   :meth:`Trainer.abort`);
4. :meth:`Trainer.record_eval` — an evaluation of a weight snapshot, written with the learner counters of that
   snapshot (time-to-target is measured in learner tokens and compute seconds, as in the paper).

Resume (:func:`open_run`): the newest checkpoint restores learner, sampler and counters; metrics past it are dropped
(redone), a checkpoint write left by a kill is set aside. One that holds its runtime's state (lockstep's,
:meth:`Trainer.attach_runtime`) resumes exactly: the runtime produces again the turns logged past the checkpoint,
which are cut from the log; otherwise those turns are queued again (they were received, so they are not lost).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from divopd.errors import UsageError
from divopd.experience import Rollout
from divopd.experience.log import ExperienceLogWriter
from divopd.experience.metrics import MetricsWriter, final_five, peak_sr
from divopd.learn.checkpoint import WeightHandle, atomic_write_text, latest_checkpoint, remove_interrupted_writes
from divopd.learn.protocol import LearnerProtocol
from divopd.sampling import Batch, Sampler, make_sampler
from divopd.sampling.paper_diagnostics import RunDiagnostics
from divopd.train import rundir
from divopd.train.checkpoints import checkpoint_write, prune_checkpoints, resume_checkpoint
from divopd.train.config import TrainConfig, dump_config, load_config
from divopd.train.interrupt import fault_point
from divopd.train.rundir import CHECKPOINTS, EXPERIENCE, EXPLORER_WEIGHTS, check_is_run, claim_run_dir
from divopd.train.runlock import lock_run_dir, release_run_dir
from divopd.train.watchdog import timed

__all__ = ["LearnerFactory", "Trainer", "open_run", "RunState"]

log = logging.getLogger(__name__)

#: Builds the run's learner: ``(cfg, checkpoint)`` → ``(learner, extra_state)``: a fresh one when ``checkpoint`` is
#: ``None`` (``extra_state`` empty), else one resumed from it (:func:`divopd.train.assemble.make_learner`).
LearnerFactory = Callable[[TrainConfig, Path | None], tuple[LearnerProtocol, dict[str, Any]]]


@dataclass
class RunState:
    """Counters the trainer carries across checkpoints (besides the learner's and the sampler's own)."""

    rollouts: int = 0
    turns: int = 0
    successes: int = 0
    teacher_turns: int = 0
    #: response positions of the received turns whose teacher log prob is not finite (not teacher-valid)
    teacher_masked_tokens: int = 0
    elapsed_s: float = 0.0
    sessions: int = 0
    #: learner-step intervals of production so far (lockstep: its polls; see :meth:`Trainer.count_production`)
    producer_intervals: int = 0
    eval_history: list[dict[str, float]] = field(default_factory=list)
    #: :class:`~divopd.sampling.paper_diagnostics.RunDiagnostics` state (Table 16 counters, Figure 6 EMA)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    #: the counts since the last update that an exact (lockstep) resume continues: turns arrived, intervals counted
    since_update: dict[str, int | None] = field(default_factory=dict)
    #: received turns that left the experience log with a part set aside as unreadable (rundir.open_log)
    log_unreadable: dict[str, Any] = field(default_factory=lambda: {"turns": 0, "parts": [], "arrivals": []})


class Trainer:
    """Learner loop pieces shared by every runtime. Not thread-safe: call it from one thread."""

    #: entries the run directory held before a fresh run claimed it (:func:`open_run`; ``None``: the run created the
    #: directory); a discarded fresh run keeps them
    preexisting: tuple[str, ...] | None = ()

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        learner: LearnerProtocol,
        sampler: Sampler,
        metrics: MetricsWriter,
        log_writer: ExperienceLogWriter | None,
        state: RunState,
    ) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.learner, self.sampler = learner, sampler
        self.metrics, self.log_writer = metrics, log_writer
        self.state = state
        self._t0 = time.monotonic() - state.elapsed_s
        self._arrived_since_update = 0
        self.paper = RunDiagnostics(state.diagnostics)
        self._published: WeightHandle | None = None
        self.publish_s = 0.0
        self.weight_load_s = 0.0  # the newest explorer-side weight load, as the arriving rollouts report it
        self._intervals_seen: int | None = None  # the runtime's interval counter at the last count_production
        self.resume_runtime: dict[str, Any] | None = None  # the checkpoint's runtime state, for attach_runtime
        self._runtime_state: Callable[[Path], dict[str, Any] | None] | None = None

    def attach_runtime(self, runtime: Any) -> None:
        """Checkpoint ``runtime``'s optional ``state_dict`` (lockstep's); on a resume, put the checkpoint's in it."""
        self._runtime_state = getattr(runtime, "state_dict", None)
        rundir.prune_explorer_weights(self.run_dir)  # what a killed session wrote past its newest checkpoint
        if self.resume_runtime is None:
            return
        from divopd.train.resume import restore_runtime

        restore_runtime(self, runtime)  # exactly, or (an env that cannot replay) as a threads run resumes

    # ------------------------------------------------------------------ 1. intake
    def intake(self, rollouts: list[Rollout]) -> int:
        """Queue finished rollouts (``.turns``, ``.info``) or chunks of running ones (``info.partial``, under
        ``explorer.enqueue: turn``; a rollout is counted by its last chunk); returns the number of turns queued."""
        n = 0
        for rollout in rollouts:
            turns = list(rollout.turns)
            arrivals = self.sampler.add(turns)
            self.paper.observe_received(turns)
            fault_point("log")
            if self.log_writer is not None and turns:
                self.log_writer.extend(turns, arrival_update=self.learner.version, arrivals=arrivals)
            n += len(turns)
            self.state.teacher_masked_tokens += sum(t.teacher_masked_tokens for t in turns)
            info = rollout.info
            self.weight_load_s = float(info.weight_load_s)
            if info.partial:
                continue
            self.state.rollouts += 1
            self.state.successes += bool(info.success)
            self.state.teacher_turns += int(info.teacher_turns)
        self.state.turns += n
        self._arrived_since_update += n
        return n

    # ------------------------------------------------------------------ 2. one update
    def compose(self) -> Batch | None:
        """Algorithm 1, steps 1-9: the batch at the current learner version, or ``None`` (not enough turns)."""
        fault_point("compose")
        return self.sampler.next_batch(self.learner.version)

    def update(self, batch: Batch, times: Mapping[str, float] | None = None) -> dict[str, float]:
        """One optimizer step on ``batch``; writes and returns the update's metrics, with ``times`` (the loop's stage
        seconds since the previous update) and ``time/update_s`` (the E.2/E.3 diagnostics and the step)."""
        fault_point("update")
        stage: dict[str, float] = {}
        with timed("time/update_s", stage):
            diag = self._diagnostics(batch)
            metrics = self.learner.step(batch)
        metrics.update(times or {})
        metrics.update(stage)
        self.publish()  # the new version's weights, gathered once (the loop hands this handle to the explorers)
        metrics["time/publish_s"] = self.publish_s
        metrics["time/weight_load_s"] = self.weight_load_s
        metrics.update(diag)
        metrics.update(self.update_metrics(batch))
        self._arrived_since_update = 0
        self.metrics.update(self.learner.version, metrics, time=self.elapsed())
        return metrics

    def update_metrics(self, batch: Batch) -> dict[str, float]:
        """The sampler's, ledger's, queue's and explorers' metrics of one update (``sampler/``, ``ledger/``, ...),
        with the run-level diagnostics of the paper's tables (Table 16 counters and the Figure 6 EMA of
        :class:`~divopd.sampling.paper_diagnostics.RunDiagnostics`)."""
        metrics = self.sampler.ledger.as_metrics(batch.stats)
        metrics.update(self.paper.observe_batch(batch.stats))
        metrics["queue/arrivals"] = float(self._arrived_since_update)
        metrics["queue/arrival_drain_ratio"] = self.arrival_drain_ratio()
        if self.state.producer_intervals:
            metrics["queue/producer_load"] = self.producer_load()
        metrics["explorer/rollouts"] = float(self.state.rollouts)
        metrics["explorer/turns"] = float(self.state.turns)
        metrics["explorer/success_rate_train"] = self.state.successes / max(1, self.state.rollouts)
        metrics["explorer/teacher_turns"] = float(self.state.teacher_turns)
        metrics["explorer/teacher_masked_tokens"] = float(self.state.teacher_masked_tokens)
        return metrics

    def after_update(self, metrics: dict[str, float], request_eval: Any, progress: Any = None) -> None:
        """The schedule after each update, shared by the runtimes: evaluation, checkpoint, progress display."""
        if self.version % self.cfg.eval.every == 0:
            request_eval()
        if self.version % self.cfg.checkpoint.every == 0:
            self.checkpoint()
        if progress is not None:
            progress.on_update(self, metrics)

    def _diagnostics(self, batch: Batch) -> dict[str, float]:
        """Appendix E.2/E.3 on this batch before its update, every ``diagnostics.every`` updates."""
        every = self.cfg.diagnostics.every
        if not every or (self.learner.version + 1) % every:
            return {}
        from divopd.learn.diagnostics import gradient_diagnostics, ranking_stability

        model, lc = self.learner.model, self.cfg.learner
        out = gradient_diagnostics(model, batch, beta=lc.beta, reduction=lc.reduction,
                                   max_rows=self.cfg.diagnostics.max_rows, seed=self.learner.version)
        out.update(ranking_stability(model, batch))
        model.zero_grad(set_to_none=True)
        return out

    def arrival_drain_ratio(self) -> float:
        """Producer load: turns received ÷ turns the learner has drained (updates × B)."""
        return self.sampler.ledger.received / max(1, self.learner.version * self.cfg.sampler.batch_size)

    def count_production(self, intervals: int | None) -> None:
        """Take the runtime's count of learner-step intervals of production (``None``: the runtime has none)."""
        if intervals is None:
            return
        self.state.producer_intervals += intervals - (self._intervals_seen or 0)
        self._intervals_seen = intervals

    def producer_load(self) -> float | None:
        """The paper's producer load (Table 2), arrival rate ÷ the learner's drain rate: turns received per
        learner-step interval of production, ÷ B. Unlike :meth:`arrival_drain_ratio` (per update taken, so ≥ 1 when
        the learner waits), it falls below 1 when the producer is slower than the learner. ``None`` without intervals
        (only the lockstep runtime counts them: one per ``env_steps_per_update`` steps)."""
        n = self.state.producer_intervals
        return self.sampler.ledger.received / (n * self.cfg.sampler.batch_size) if n else None

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    @property
    def version(self) -> int:
        return self.learner.version

    def publish(self) -> WeightHandle:
        """The current version's weight handle, made once per version (a sharded learner gathers it on rank 0);
        ``publish_s`` is how long making it took."""
        if self._published is None or self._published.version != self.learner.version:
            t0 = time.perf_counter()
            self._published = self.learner.publish()
            self.publish_s = time.perf_counter() - t0
        return self._published

    # ------------------------------------------------------------------ 3. checkpoints
    def checkpoint(self) -> Path | None:
        """Write ``checkpoints/update-NNNNNN`` atomically and prune old ones. After a learner rank died there is
        nothing to write from: the newest checkpoint on disk (``None`` if none) is the one to resume from."""
        failed = self.learner.failed
        if failed is not None:
            ckpt = latest_checkpoint(self.run_dir / CHECKPOINTS)
            log.error("%s; the run stopped; resume from %s with `divopd train --resume %s`", failed,
                      ckpt if ckpt is not None else "the start (no checkpoint yet)", self.run_dir)
            if self.log_writer is not None:
                self.log_writer.roll()
            return ckpt
        if self.log_writer is not None:
            self.log_writer.roll()  # every logged turn is in a finished, readable part from here on
        self.state.elapsed_s = self.elapsed()
        self.state.since_update = {"arrived": self._arrived_since_update, "intervals_seen": self._intervals_seen}
        extra = {"sampler": self.sampler.state_dict(), "run": self.state.__dict__}
        if self._runtime_state is not None and (runtime := self._runtime_state(self.run_dir / EXPLORER_WEIGHTS)):
            extra["runtime"] = runtime
        path = self.run_dir / CHECKPOINTS / f"update-{self.learner.version:06d}"
        fault_point("checkpoint")
        with checkpoint_write(path, self.run_dir):  # disk full: one line, nothing partial, the newest good one kept
            self.learner.save_checkpoint(path, extra_state=extra)
        kept = prune_checkpoints(self.run_dir / CHECKPOINTS, self.cfg.checkpoint.keep)
        rundir.prune_explorer_weights(self.run_dir, kept)
        if self.log_writer is not None:
            self.log_writer.compact()  # this interval's parts as one file
        return path

    # ------------------------------------------------------------------ 4. evaluation
    def record_eval(self, update: int, counters: dict[str, float], results: dict[str, float]) -> None:
        """Write one evaluation of the snapshot taken at learner ``update`` (``counters``: its learner counters)."""
        record = {**results, **counters}
        self.metrics.eval(update, record, time=self.elapsed())
        self.state.eval_history.append({"update": update, **record})

    def snapshot_counters(self) -> dict[str, float]:
        return {"learner/tokens_total": float(self.learner.tokens_total),
                "learner/compute_s_total": float(self.learner.compute_s_total)}

    # ------------------------------------------------------------------ end
    def summary(self) -> dict[str, Any]:
        srs = [e["eval/success_rate"] for e in sorted(self.state.eval_history, key=lambda e: e["update"])]
        five = final_five(srs)
        return {
            "setting": self.cfg.setting,
            "method": self.cfg.method,
            "seed": self.cfg.seed,
            "updates": self.learner.version,
            "elapsed_s": self.elapsed(),
            "learner_tokens_total": self.learner.tokens_total,
            "learner_compute_s_total": self.learner.compute_s_total,
            "ledger": asdict(self.sampler.ledger),
            "rollouts": self.state.rollouts,
            "turns": self.state.turns,
            "arrival_drain_ratio": self.arrival_drain_ratio(),
            "producer_load": self.producer_load(),
            "producer_intervals": self.state.producer_intervals,
            "log/unreadable_turns": self.state.log_unreadable["turns"],  # received, not in the log (rundir.open_log)
            "log/unreadable_parts": self.state.log_unreadable["parts"],
            "peak_sr": peak_sr(srs),
            "final_five_sr": five[0] if five else None,
            "final_five_sr_std": five[1] if five else None,
        }

    def close(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json`` (the summary plus ``extra``, e.g. ``interrupted``) and close the run's files."""
        summary = {**self.summary(), **(extra or {})}
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=float))
        self._close_files()
        return summary

    def abort(self, at_boundary: bool = False) -> Path | None:
        """Close the run's files after a failure, without ``summary.json`` (the run stays unfinished); checkpoint
        first only ``at_boundary`` (else the newest good checkpoint stays as it is). Returns the one to resume from."""
        try:
            return self.checkpoint() if at_boundary else latest_checkpoint(self.run_dir / CHECKPOINTS)
        finally:
            self._close_files()

    def _close_files(self) -> None:
        if self.log_writer is not None:
            self.log_writer.close()
        self.metrics.close()
        self.learner.close()
        release_run_dir(self.run_dir)


# ---------------------------------------------------------------------------------------------------- set-up
def open_run(cfg: TrainConfig | None = None, *, resume: str | Path | None = None,
             make_learner: LearnerFactory) -> tuple[Trainer, bool]:
    """Create a run directory (or reopen one to resume) and build the learner-side pieces; ``make_learner`` builds
    the learner (:func:`divopd.train.assemble.open_run` passes the run's choice of single or sharded learner).

    Returns ``(trainer, resumed)``. A fresh run refuses a directory that already holds a run.
    """
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"--resume {run_dir}: no config.yaml there; is it a divopd run directory?")
        check_is_run(run_dir)
        lock_run_dir(run_dir)  # before anything is touched: one writing process per run directory
        saved = load_config(run_dir / "config.yaml")
        cfg = saved if cfg is None else cfg
    if cfg is None:
        raise ValueError("open_run needs a config or a run directory to resume")
    run_dir = Path(resume) if resume is not None else cfg.resolved_run_dir()
    for line in remove_interrupted_writes(run_dir / CHECKPOINTS) if resume is not None else []:
        log.warning("resume: %s", line)
    ckpt = resume_checkpoint(run_dir)  # the newest that verifies; damaged newer ones set aside, one warning
    if resume is not None and ckpt is None:  # nothing to restore: refuse, and delete nothing
        raise UsageError(f"--resume {run_dir}: no checkpoint there, nothing to resume from (the run stopped before "
                         f"its first checkpoint); start it afresh with `divopd train {run_dir}/config.yaml --run-dir "
                         f"{run_dir}`: its old files are kept in {run_dir}/stranded-<time>/")
    before = [] if resume is not None else claim_run_dir(run_dir)  # a fresh run marks its directory first
    atomic_write_text(run_dir / "config.yaml", dump_config(cfg))

    sampler = make_sampler(cfg.sampler_config())
    state = RunState()
    fault_point("load")
    extra: dict[str, Any] = {}
    if ckpt is not None:
        learner, extra = make_learner(cfg, ckpt)
        sampler.load_state_dict(extra["sampler"])
        state = RunState(**{k: v for k, v in extra.get("run", {}).items() if k in RunState.__dataclass_fields__})
        version = learner.version
    else:
        learner, _ = make_learner(cfg, None)
        version = 0
    state.sessions += 1

    # lockstep (runtime state): the log is cut by Trainer.attach_runtime once the state is back; else re-queued
    log_writer = rundir.open_log(cfg, run_dir / EXPERIENCE, sampler, state, version if ckpt is not None else None,
                                 exact=extra.get("runtime") is not None) if cfg.log_experience else None
    metrics = MetricsWriter(run_dir, time_offset=state.elapsed_s, truncate_after=version if resume else None)
    state.eval_history = [e for e in state.eval_history if e["update"] <= version]
    trainer = Trainer(cfg, run_dir, learner, sampler, metrics, log_writer, state)
    trainer.preexisting = None if before is None else tuple(before)
    trainer.resume_runtime = extra.get("runtime")
    return trainer, ckpt is not None

