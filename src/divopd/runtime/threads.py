"""Embedded runtime: explorer threads and an evaluator thread feed the learner on the main thread.

    explorer threads ──(bounded queue of finished rollouts: backpressure)──► main thread: Trainer
          ▲                                                                    │ intake → step → publish
          └──────────────────────── newest WeightHandle ◄──────────────────────┘
    evaluator thread ◄── (update, snapshot) requests;  results ──► main thread writes them

Shutdown order: (1) the main loop stops at ``updates``/``max_seconds``/Ctrl-C; (2) the stop event is set and explorer
threads finish the rollout in hand (a full queue is not waited on) and every finished rollout still in the queue is
taken into the sampler, so the final ledger counts it as queued; (3) pending evaluations finish (skipped on
Ctrl-C) and the final snapshot is evaluated; (4) the trainer checkpoints and writes ``summary.json``.

Threads rather than processes: torch releases the GIL inside its kernels, the weights are shared in memory without
copies, and a single process is what `make demo` needs; see the README's measurement of the alternatives.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from typing import Any

import torch

from divopd.config import TrainConfig
from divopd.runtime.common import LatestWeights, build_explorer, load_teacher, step_limit
from divopd.trainer import Trainer

__all__ = ["run_embedded"]

log = logging.getLogger(__name__)


class ExplorerWorker(threading.Thread):
    """Runs one Explorer: collect a rollout, hand it to the learner, pick up newer weights; restart on failure."""

    def __init__(self, cfg: TrainConfig, idx: int, session: int, weights: LatestWeights, teacher: Any,
                 out: queue.Queue, stop: threading.Event, max_restarts: int = 3) -> None:
        super().__init__(name=f"explorer-{idx}", daemon=True)
        self.cfg, self.idx, self.session = cfg, idx, session
        self.weights, self.teacher, self.out, self.stop_event = weights, teacher, out, stop
        self.max_restarts = max_restarts
        self.restarts = 0
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._loop()
                return
            except Exception:  # noqa: BLE001 — an explorer failure is logged, counted and the worker restarted
                self.error = traceback.format_exc()
                log.error("explorer %d failed:\n%s", self.idx, self.error)
                self.restarts += 1
                if self.restarts > self.max_restarts:
                    return

    def _loop(self) -> None:
        # a restarted worker takes a fresh id prefix so rollout ids never repeat
        session = self.session * 100 + self.restarts
        explorer = build_explorer(self.cfg, self.idx, session, self.weights.get(), self.teacher)
        try:
            while not self.stop_event.is_set():
                handle = self.weights.get()
                explorer.set_weights(handle)
                explorer.config.max_steps = step_limit(self.cfg, handle.version)
                (rollout,) = explorer.collect(1)
                while not self.stop_event.is_set():
                    try:
                        self.out.put(rollout, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        finally:
            explorer.close()


class EvalWorker(threading.Thread):
    """Evaluates weight snapshots on held-out tasks, in request order, with its own student copy (no teacher)."""

    def __init__(self, cfg: TrainConfig, session: int, weights: LatestWeights, stop: threading.Event) -> None:
        super().__init__(name="evaluator", daemon=True)
        self.cfg, self.session, self.weights, self.stop_event = cfg, session, weights, stop
        self.requests: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.error: str | None = None

    def request(self, update: int, handle: Any, counters: dict[str, float]) -> None:
        self.requests.put((update, handle, counters))

    def run(self) -> None:
        explorer = None
        try:
            explorer = build_explorer(self.cfg, 999, self.session, self.weights.get(), None, evaluation=True)
            while True:
                item = self.requests.get()
                if item is None or self.stop_event.is_set():
                    return
                update, handle, counters = item
                explorer.set_weights(handle)
                results = explorer.evaluate(num_tasks=self.cfg.eval.tasks)
                self.results.put((update, counters, results))
        except Exception:  # noqa: BLE001
            self.error = traceback.format_exc()
            log.error("evaluator failed:\n%s", self.error)
        finally:
            if explorer is not None:
                explorer.close()


def _drain(q: queue.Queue, first: Any = None) -> list[Any]:
    items = [] if first is None else [first]
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


def run_embedded(trainer: Trainer, progress: Any = None) -> dict[str, Any]:
    """Run training to ``cfg.updates`` (or ``max_seconds`` / Ctrl-C). Returns the run summary."""
    cfg = trainer.cfg
    torch.set_num_threads(cfg.runtime.torch_threads)
    session = trainer.state.sessions
    stop = threading.Event()
    rollouts: queue.Queue = queue.Queue(maxsize=cfg.runtime.queue_rollouts)
    weights = LatestWeights(trainer.publish())
    teacher, _ = load_teacher(cfg)
    workers = [ExplorerWorker(cfg, i, session, weights, teacher, rollouts, stop, cfg.runtime.max_explorer_restarts)
               for i in range(cfg.runtime.num_explorers)]
    abort = threading.Event()  # set on Ctrl-C: pending evaluations are skipped
    evaluator = EvalWorker(cfg, session, weights, abort)
    evaluated: set[int] = {int(e["update"]) for e in trainer.state.eval_history}
    outstanding = 0

    def request_eval() -> None:
        nonlocal outstanding
        if trainer.version not in evaluated:
            evaluated.add(trainer.version)
            evaluator.request(trainer.version, weights.get(), trainer.snapshot_counters())
            outstanding += 1

    def collect_evals(block: bool = False) -> None:
        nonlocal outstanding
        while outstanding:
            try:
                update, counters, results = evaluator.results.get(timeout=1.0) if block else \
                    evaluator.results.get_nowait()
            except queue.Empty:
                if block and evaluator.is_alive():
                    continue
                return
            trainer.record_eval(update, counters, results)
            outstanding -= 1
            if progress is not None:
                progress.on_eval(update, results)

    for w in workers:
        w.start()
    evaluator.start()
    if cfg.eval.at_start and trainer.version == 0:
        request_eval()
    deadline = None if cfg.max_seconds is None else time.monotonic() + cfg.max_seconds
    interrupted = False
    try:
        while trainer.version < cfg.updates:
            if deadline is not None and time.monotonic() > deadline:
                log.info("max_seconds reached at update %d", trainer.version)
                break
            trainer.intake(_drain(rollouts))
            metrics = trainer.step()
            collect_evals()
            if metrics is None:
                if not any(w.is_alive() for w in workers):
                    raise RuntimeError("every explorer has stopped; last error:\n"
                                       + next((w.error for w in workers if w.error), "none"))
                try:
                    trainer.intake(_drain(rollouts, rollouts.get(timeout=0.5)))
                except queue.Empty:
                    pass
                continue
            weights.set(trainer.publish())
            trainer.after_update(metrics, request_eval, progress)
    except KeyboardInterrupt:
        interrupted = True
        abort.set()
        log.warning("interrupted at update %d: checkpointing", trainer.version)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
        trainer.intake(_drain(rollouts))  # finished rollouts still in the queue enter the ledger (as queued)
        if not interrupted:
            request_eval()  # the final snapshot
            collect_evals(block=True)
        evaluator.requests.put(None)
        evaluator.join(timeout=5 if interrupted else 600)
        collect_evals()
        trainer.checkpoint()
    summary = trainer.close()
    summary["interrupted"] = interrupted
    summary["explorer_restarts"] = sum(w.restarts for w in workers)
    return summary
