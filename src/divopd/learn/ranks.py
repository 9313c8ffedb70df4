"""Learner ranks as processes spawned on this machine (``learner.world_size > 1`` outside Ray). They die with the
driver and ignore a terminal's Ctrl-C: the driver checkpoints through them, then closes them.
"""

from __future__ import annotations

import os
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

__all__ = ["LearnerRankError", "ProcessRanks", "Ranks", "ReplyDeadline"]


class LearnerRankError(RuntimeError):
    """A learner rank died or failed; the sharded learner stopped (resume from the newest checkpoint)."""


class Ranks(Protocol):
    """How the sharded learner reaches its ranks (processes here, Ray actors in the Ray runtime)."""

    world_size: int
    info: list[dict[str, Any]]

    def call(self, method: str, args: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``RankWorker.<method>(*args[r])`` on every rank r at once; the replies in rank order."""

    def close(self) -> None:
        """End every rank."""


def _rank_main(rank: int, world_size: int, init_method: str, setup: dict[str, Any], conn: Connection,
               parent_pid: int) -> None:
    from divopd.explore.children import die_with_parent
    from divopd.learn.dist_worker import RankWorker

    die_with_parent(parent_pid)  # SIGINT is blocked here (ProcessRanks starts it so): the driver stops the rank

    worker = RankWorker()
    method, args, kwargs = "setup", (rank, world_size, init_method), setup  # the first call, then the driver's
    try:
        while method != "close":
            try:
                conn.send(("ok", getattr(worker, method)(*args, **kwargs)))
            except Exception:  # noqa: BLE001 — reported to the driver, which raises it
                conn.send(("error", traceback.format_exc()))
                return
            kwargs = {}
            try:
                method, args = conn.recv()
            except (EOFError, OSError):  # the driver is gone
                return
    finally:
        worker.close()


#: Seconds past ``runtime.collective_timeout_s`` that the driver waits for the other ranks once one has answered.
REPLY_SLACK_S = 60.0


class ReplyDeadline:
    """The driver's deadlines for the ranks' answers to one call: the first within ``call_timeout_s`` of the call, each
    other one within ``collective_timeout_s`` + :data:`REPLY_SLACK_S` of the first (``None``: no deadline)."""

    def __init__(self, call_timeout_s: float | None, collective_timeout_s: float | None) -> None:
        self.call_timeout_s, self.collective_timeout_s = call_timeout_s, collective_timeout_s
        self._called = time.monotonic()
        self.first_answer: float | None = None

    def wait_s(self) -> float | None:
        """Seconds left to wait for the next answer (``None``: no deadline)."""
        if self.first_answer is None:
            since, limit = self._called, self.call_timeout_s
        else:
            since = self.first_answer
            limit = None if self.collective_timeout_s is None else self.collective_timeout_s + REPLY_SLACK_S
        return None if limit is None else max(0.0, since + limit - time.monotonic())

    def answered(self) -> None:
        if self.first_answer is None:
            self.first_answer = time.monotonic()


class ProcessRanks:
    """N learner ranks as spawned processes (a :class:`~divopd.learn.dist_worker.RankWorker` each, behind a pipe); a
    rank that exits or raises ends the others and raises :class:`LearnerRankError` naming it, its pid and exit code."""

    def __init__(self, world_size: int, setup: dict[str, Any], call_timeout_s: float | None = None) -> None:
        import torch.multiprocessing as mp

        from divopd.explore.children import sigint_blocked
        from divopd.learn.dist_worker import free_port

        ctx = mp.get_context("spawn")
        self.world_size = world_size
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._closed = False
        timeout = setup.get("collective_timeout_s")
        self._timeout_s: float | None = None if timeout is None else float(timeout)
        self._call_timeout_s = call_timeout_s  # the first rank's answer to one call (None: no deadline)
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(rank, world_size, init_method, setup, child, os.getpid()),
                               daemon=True, name=f"divopd-learner-rank{rank}")
            # a terminal's Ctrl-C is for the driver, which checkpoints, then closes the ranks
            with sigint_blocked(multiprocessing=True):
                proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        self.info: list[dict[str, Any]] = self._gather("setup")

    @property
    def pids(self) -> list[int]:
        return [int(p.pid) for p in self._procs]

    def call(self, method: str, args: list[tuple[Any, ...]]) -> list[Any]:
        if self._closed:
            raise LearnerRankError("the sharded learner's ranks were stopped")
        for rank, conn in enumerate(self._conns):
            try:
                conn.send((method, args[rank]))
            except (BrokenPipeError, OSError):
                self._fail(rank, f"could not send {method!r}")
        return self._gather(method)

    def _gather(self, method: str) -> list[Any]:
        """The replies in rank order within the call's :class:`ReplyDeadline`; a rank that misses it ends them all."""
        replies: dict[int, Any] = {}
        deadline = ReplyDeadline(self._call_timeout_s, self._timeout_s)
        while len(replies) < self.world_size:
            pending = [r for r in range(self.world_size) if r not in replies]
            handles = {self._conns[r]: r for r in pending} | {self._procs[r].sentinel: r for r in pending}
            ready_now = wait(list(handles), timeout=deadline.wait_s())
            if not ready_now and deadline.first_answer is None:
                self._fail(pending[0], f"and every other rank gave no answer to {method!r} within "
                           f"runtime.rank_call_timeout_s = {self._call_timeout_s:g} s")
            if not ready_now:
                others = f"and {len(pending) - 1} other rank(s) " if len(pending) > 1 else ""
                self._fail(pending[0], f"{others}gave no answer to {method!r} within "
                           f"runtime.collective_timeout_s = {self._timeout_s:g} s (+{REPLY_SLACK_S:g}) of the first "
                           "rank's")
            deadline.answered()
            for ready in ready_now:
                rank = handles[ready]
                if rank in replies:
                    continue
                conn = self._conns[rank]
                if ready is not conn and not conn.poll():
                    self._fail(rank, f"exited during {method!r}")
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    self._fail(rank, f"exited during {method!r}")
                if status != "ok":
                    self._fail(rank, f"failed during {method!r}:\n{value}")
                replies[rank] = value
        return [replies[r] for r in range(self.world_size)]

    def _fail(self, rank: int, what: str) -> None:
        proc = self._procs[rank]
        proc.join(timeout=1)
        code = proc.exitcode
        self.close(kill=True)
        raise LearnerRankError(f"learner rank {rank} of {self.world_size} (pid {proc.pid}, exit code {code}) {what}; "
                               "the sharded learner stopped")

    def close(self, kill: bool = False) -> None:
        """Ask every rank to stop, then end those still running; ``kill``: end them at once (after a rank failed)."""
        if self._closed:
            return
        self._closed = True
        for conn in [] if kill else self._conns:
            try:
                conn.send(("close", ()))
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=0 if kill else 10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
