"""The learner side of a run, free of any runtime: the stages the one loop (:mod:`divopd.train.loop`) calls and the
run's counters across checkpoints."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from divopd.experience import Rollout
from divopd.experience.log import ExperienceLogWriter
from divopd.experience.metrics import MetricsWriter, final_five, peak_sr
from divopd.learn.checkpoint import WeightHandle, atomic_write_text, latest_checkpoint
from divopd.learn.protocol import LearnerProtocol
from divopd.sampling import Batch, Sampler, make_sampler
from divopd.sampling.paper_diagnostics import RunDiagnostics
from divopd.train import rundir
from divopd.train.checkpoints import checkpoint_write, prune_checkpoints
from divopd.train.config import TrainConfig
from divopd.train.interrupt import fault_point
from divopd.train.protocol import Runtime
from divopd.train.rundir import CHECKPOINTS, EXPERIENCE, EXPLORER_WEIGHTS, OpenedRunDir
from divopd.train.watchdog import timed

__all__ = ["RunState", "Trainer"]

log = logging.getLogger(__name__)


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
    """The learner side's stages and counters (one thread); holds the run directory's lock until its files close."""

    def __init__(self, cfg: TrainConfig, run_dir: OpenedRunDir, learner: LearnerProtocol, sampler: Sampler,
                 metrics: MetricsWriter, log_writer: ExperienceLogWriter | None, state: RunState,
                 resume_runtime: dict[str, Any] | None = None) -> None:
        self.cfg, self.run_dir = cfg, run_dir.path
        #: entries the run directory held before a fresh run claimed it (``None``: the run created the directory)
        self.preexisting = run_dir.preexisting
        self._held = run_dir.held  # the run directory's lock, released when the files close
        self.learner, self.sampler = learner, sampler
        self.metrics, self.log_writer = metrics, log_writer
        self.state = state
        self.resume_runtime = resume_runtime  # the checkpoint's runtime state, for attach_runtime
        self._t0 = time.monotonic() - state.elapsed_s
        self._arrived_since_update = 0
        self.paper = RunDiagnostics(state.diagnostics)
        self._published: WeightHandle | None = None
        self.publish_s = 0.0
        self.weight_load_s = 0.0  # the newest explorer-side weight load, as the arriving rollouts report it
        self._intervals_seen: int | None = None  # the runtime's interval counter at the last count_production
        self._runtime: Runtime | None = None
        self.closed = False  # the run's files are closed and the lock let go

    @classmethod
    def open(cls, run_dir: OpenedRunDir, learner: LearnerProtocol, extra: dict[str, Any]) -> Trainer:
        """The trainer of a run whose learner is built: fresh, or resumed from ``extra`` (the checkpoint's
        ``extra_state``: sampler, counters, runtime state; metrics past it dropped)."""
        cfg = run_dir.cfg
        sampler = make_sampler(cfg.sampler_config())
        state = RunState()
        resumed = run_dir.checkpoint is not None
        if resumed:
            sampler.load_state_dict(extra["sampler"])
            state = RunState(**{k: v for k, v in extra.get("run", {}).items() if k in RunState.__dataclass_fields__})
        version = learner.version if resumed else 0
        state.sessions += 1
        log_writer = rundir.open_log(cfg, run_dir.path / EXPERIENCE, sampler, state, version if resumed else None,
                                     exact=extra.get("runtime") is not None) if cfg.log_experience else None
        metrics = MetricsWriter(run_dir.path, time_offset=state.elapsed_s,
                                truncate_after=version if run_dir.resumed else None)
        state.eval_history = [e for e in state.eval_history if e["update"] <= version]
        return cls(cfg, run_dir, learner, sampler, metrics, log_writer, state, extra.get("runtime"))

    def attach_runtime(self, runtime: Runtime) -> None:
        """Checkpoint ``runtime``'s own state from now on (lockstep's); on a resume, restore the checkpoint's."""
        self._runtime = runtime if runtime.keeps_state else None
        rundir.prune_explorer_weights(self.run_dir)  # what a killed session wrote past its newest checkpoint
        if self.resume_runtime is None:
            return
        from divopd.train.resume import restore_runtime

        restore_runtime(self, runtime)

    @property
    def version(self) -> int:
        return self.learner.version

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def intake(self, rollouts: list[Rollout]) -> int:
        """Queue and log rollouts (or chunks, ``info.partial``: a rollout counts at its last), tagged with the
        learner version at arrival; returns the number of turns queued."""
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

    def count_production(self, intervals: int | None) -> None:
        """Take the runtime's count of learner-step intervals of production (``None``: the runtime has none)."""
        if intervals is None:
            return
        self.state.producer_intervals += intervals - (self._intervals_seen or 0)
        self._intervals_seen = intervals

    def compose(self) -> Batch | None:
        """Algorithm 1, steps 1-9: the batch at the current learner version, or ``None`` (not enough turns)."""
        fault_point("compose")
        return self.sampler.next_batch(self.learner.version)

    def update(self, batch: Batch, times: Mapping[str, float] | None = None) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics, with ``times`` (the loop's stage seconds since the
        previous update) and ``time/update_s``."""
        fault_point("update")
        stage: dict[str, float] = {}
        with timed("time/update_s", stage):
            diag = self._diagnostics(batch)
            metrics = self.learner.step(batch)
        metrics.update(times or {})
        metrics.update(stage)
        metrics.update(diag)
        metrics.update(self.update_metrics(batch))
        self._arrived_since_update = 0
        return metrics

    def publish(self) -> WeightHandle:
        """The current version's weight handle, made once per version (timed in ``publish_s``)."""
        if self._published is None or self._published.version != self.learner.version:
            t0 = time.perf_counter()
            self._published = self.learner.publish()
            self.publish_s = time.perf_counter() - t0
        return self._published

    def record_update(self, metrics: dict[str, float]) -> None:
        """Write an update's metrics record, with the publish and the explorers' newest weight-load seconds."""
        metrics["time/publish_s"] = self.publish_s
        metrics["time/weight_load_s"] = self.weight_load_s
        self.metrics.update(self.learner.version, metrics, time=self.elapsed())

    def update_metrics(self, batch: Batch) -> dict[str, float]:
        """One update's ``sampler/``, ``ledger/``, ``queue/`` and ``explorer/`` metrics, with the paper's run-level
        diagnostics (Table 16 counters, the Figure 6 EMA)."""
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

    def producer_load(self) -> float | None:
        """The paper's producer load (Table 2): turns received per learner-step interval of production, ÷ B (below 1
        when the producer is slower than the learner). ``None`` without intervals (only lockstep counts them)."""
        n = self.state.producer_intervals
        return self.sampler.ledger.received / (n * self.cfg.sampler.batch_size) if n else None

    def checkpoint(self) -> Path | None:
        """Write ``checkpoints/update-NNNNNN`` atomically and prune old ones; returns it. After a learner rank died:
        nothing is written, the newest on disk (``None``: none) is returned."""
        failed = self.learner.failed
        if self.log_writer is not None:
            self.log_writer.roll()  # every logged turn is in a finished, readable part from here on
        if failed is not None:
            ckpt = latest_checkpoint(self.run_dir / CHECKPOINTS)
            log.error("%s; the run stopped; resume from %s with `divopd train --resume %s`", failed,
                      ckpt if ckpt is not None else "the start (no checkpoint yet)", self.run_dir)
            return ckpt
        self.state.elapsed_s = self.elapsed()
        self.state.since_update = {"arrived": self._arrived_since_update, "intervals_seen": self._intervals_seen}
        extra = {"sampler": self.sampler.state_dict(), "run": self.state.__dict__}
        if self._runtime is not None and (runtime := self._runtime.state_dict(self.run_dir / EXPLORER_WEIGHTS)):
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

    def record_eval(self, update: int, counters: dict[str, float], results: dict[str, float]) -> None:
        """Write one evaluation of the snapshot taken at learner ``update`` with its learner ``counters``."""
        record = {**results, **counters}
        self.metrics.eval(update, record, time=self.elapsed())
        self.state.eval_history.append({"update": update, **record})

    def snapshot_counters(self) -> dict[str, float]:
        """The learner counters an evaluation of the current weights is recorded with."""
        return {"learner/tokens_total": float(self.learner.tokens_total),
                "learner/compute_s_total": float(self.learner.compute_s_total)}

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
        """After a failure: checkpoint only ``at_boundary``, close without ``summary.json``; returns where to resume."""
        try:
            return self.checkpoint() if at_boundary else latest_checkpoint(self.run_dir / CHECKPOINTS)
        finally:
            self._close_files()

    def _close_files(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.log_writer is not None:
            self.log_writer.close()
        self.metrics.close()
        self.learner.close()
        self._held.close()
