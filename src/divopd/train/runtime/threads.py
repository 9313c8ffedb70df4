"""Threads runtime: explorer threads feed the one loop on the main thread through a bounded rollout queue and pick
up the newest weights; an evaluator thread evaluates snapshots. At shutdown every finished rollout goes back to the
loop (received = ``produced_turns``). Threads, not processes: torch releases the GIL and weights are shared uncopied."""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from typing import Any

import torch

from divopd.errors import UsageError
from divopd.explore.explorer import Rollout
from divopd.explore.weight_loading import close_backend
from divopd.learn.checkpoint import WeightHandle
from divopd.train.config import TrainConfig
from divopd.train.interrupt import fault_point
from divopd.train.protocol import EvalResult, StatelessRuntime
from divopd.train.runtime.common import build_explorer, load_teacher

__all__ = ["ThreadsRuntime"]

log = logging.getLogger(__name__)

SHUTDOWN_JOIN_S = 60  # how long shutdown waits for each explorer thread to finish its rollout in hand


class LatestWeights:
    """The newest published weight handle, shared with explorer workers (thread-safe)."""

    def __init__(self, handle: WeightHandle) -> None:
        self._lock = threading.Lock()
        self._handle = handle

    def set(self, handle: WeightHandle) -> None:
        with self._lock:
            if handle.version >= self._handle.version:
                self._handle = handle

    def get(self) -> WeightHandle:
        with self._lock:
            return self._handle


class ExplorerWorker(threading.Thread):
    """Runs one Explorer: collect a rollout, queue it, pick up newer weights; restart on failure."""

    def __init__(self, cfg: TrainConfig, idx: int, session: int, weights: LatestWeights, teacher: Any,
                 out: queue.Queue, stop: threading.Event, max_restarts: int = 3) -> None:
        super().__init__(name=f"explorer-{idx}", daemon=True)
        self.cfg, self.idx, self.session = cfg, idx, session
        self.weights, self.teacher, self.out, self.stop_event = weights, teacher, out, stop
        self.max_restarts = max_restarts
        self.restarts = 0
        self.produced_turns = 0  # turns of the rollouts this worker finished (all of them reach the loop)
        self.in_hand: list[Rollout] = []  # finished after the stop with the queue full: handed over at shutdown
        self.error: str | None = None
        self.usage_error: UsageError | None = None  # bad input (e.g. explorer.env_kwargs): no restart can fix it

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._loop()
                return
            except UsageError as exc:
                self.usage_error, self.error = exc, str(exc)
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
                explorer.set_weights(self.weights.get())  # loaded at the next rollout; the step limit follows
                (rollout,) = explorer.collect(1)
                self.produced_turns += len(rollout.turns)
                self._hand_over(rollout)
        finally:
            explorer.close()

    def _hand_over(self, rollout: Rollout) -> None:
        """Queue a rollout, waiting while the queue is full; after the stop, keep it ``in_hand`` instead."""
        while True:
            try:
                self.out.put(rollout, timeout=0.2)
                return
            except queue.Full:
                if self.stop_event.is_set():
                    self.in_hand.append(rollout)
                    return


class EvalWorker(threading.Thread):
    """Evaluates weight snapshots on held-out tasks, in request order, with its own student copy (no teacher)."""

    def __init__(self, cfg: TrainConfig, session: int, weights: LatestWeights, abort: threading.Event) -> None:
        super().__init__(name="evaluator", daemon=True)
        self.cfg, self.session, self.weights, self.abort = cfg, session, weights, abort
        self.requests: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.error: str | None = None

    def run(self) -> None:
        explorer = None
        try:
            explorer = build_explorer(self.cfg, 999, self.session, self.weights.get(), None, evaluation=True)
            while True:
                try:
                    item = self.requests.get(timeout=1.0)  # an idle evaluator looks at the abort flag every second
                except queue.Empty:
                    if self.abort.is_set():
                        return
                    continue
                if item is None or self.abort.is_set():
                    return
                update, handle, counters = item
                explorer.set_weights(handle)
                fault_point("eval")
                results = explorer.evaluate(num_tasks=self.cfg.eval.tasks, **self.cfg.eval.sampling(self.cfg.seed))
                self.results.put(EvalResult(update, counters, results))
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


def _take(q: queue.Queue, timeout: float) -> list[Any]:
    """Everything in ``q``, waiting up to ``timeout`` seconds for the first item."""
    try:
        return _drain(q, q.get(timeout=timeout) if timeout > 0 else q.get_nowait())
    except queue.Empty:
        return []


class ThreadsRuntime(StatelessRuntime):
    """The :class:`~divopd.train.protocol.Runtime` of explorer threads in this process (``runtime.kind: threads``)."""

    def __init__(self, cfg: TrainConfig, weights: WeightHandle, session: int) -> None:
        self.cfg = cfg
        torch.set_num_threads(cfg.runtime.torch_threads)
        self._stop = threading.Event()
        self._abort = threading.Event()  # set on Ctrl-C: pending evaluations are skipped
        self._rollouts: queue.Queue = queue.Queue(maxsize=cfg.runtime.queue_rollouts)
        self._weights = LatestWeights(weights)
        teacher, _ = load_teacher(cfg)
        self._teacher = teacher  # a vLLM teacher engine is shut down in close()
        self._workers = [ExplorerWorker(cfg, i, session, self._weights, teacher, self._rollouts, self._stop,
                                        cfg.runtime.max_explorer_restarts) for i in range(cfg.runtime.num_explorers)]
        self._evaluator = EvalWorker(cfg, session, self._weights, self._abort)
        for w in self._workers:
            w.start()
        self._evaluator.start()

    def poll(self, timeout: float) -> list[Rollout]:
        return _take(self._rollouts, timeout)

    def check_alive(self) -> None:
        bad = next((w.usage_error for w in self._workers if w.usage_error is not None), None)
        if bad is not None:
            raise bad  # the input error itself: the CLI prints it on one line and exits 2
        if not any(w.is_alive() for w in self._workers):
            raise RuntimeError("every explorer has stopped; last error:\n"
                               + next((w.error for w in self._workers if w.error), "none"))

    def publish(self, handle: WeightHandle) -> None:
        self._weights.set(handle)

    def request_eval(self, update: int, handle: WeightHandle, counters: dict[str, float]) -> None:
        self._evaluator.requests.put((update, handle, counters))

    def eval_results(self, timeout: float) -> list[EvalResult]:
        return _take(self._evaluator.results, timeout)

    def evals_pending(self) -> bool:
        return self._evaluator.is_alive() or not self._evaluator.results.empty()

    def shutdown(self, interrupted: bool) -> list[Rollout]:
        if interrupted:
            self._abort.set()
        self._stop.set()
        for w in self._workers:
            w.join(timeout=SHUTDOWN_JOIN_S)
        busy = [w.idx for w in self._workers if w.is_alive()]
        if busy:
            log.warning("explorers %s still in a rollout %d s after the stop: their rollouts in hand are not counted",
                        busy, SHUTDOWN_JOIN_S)
        return _drain(self._rollouts) + [r for w in self._workers for r in w.in_hand]

    @property
    def produced_turns(self) -> int:
        return sum(w.produced_turns for w in self._workers)

    def close(self, interrupted: bool) -> dict[str, Any]:
        if interrupted:
            self._abort.set()
        self._evaluator.requests.put(None)
        self._evaluator.join(timeout=5 if interrupted else 600)
        busy = [w.idx for w in self._workers if w.is_alive()]
        if busy:  # an explorer still in a teacher call: the engine must not go away under it
            log.warning("explorers %s are still running at close: the teacher is left open", busy)
        else:
            close_backend(self._teacher)
        return {"explorer_restarts": sum(w.restarts for w in self._workers), "produced_turns": self.produced_turns}
