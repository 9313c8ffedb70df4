"""Stage times and the stall watchdog of the one loop: no progress, a teacher that cannot score, or a gate that
rejects every turn stops the run (checkpoint, ``stalled`` in ``summary.json``, exit :data:`EXIT_STALLED`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from divopd.experience import Rollout

log = logging.getLogger(__name__)

__all__ = ["EXIT_STALLED", "EXPLORER_TIMES", "TEACHER_WINDOW_BATCHES", "Watchdog", "add_explorer_times",
           "note_stall", "stall_notes", "timed"]

#: Exit code of ``divopd train`` when the watchdog stopped the run (checkpointed; ``--resume`` continues it).
EXIT_STALLED = 3
#: A teacher cannot score after this many × ``sampler.batch_size`` received turns in a row without teacher log probs.
TEACHER_WINDOW_BATCHES = 4

#: The config key (or part of the setup) that governs each of the gate's rejection reasons.
REASON_KEYS = {
    "prompt_truncated": "explorer.prompt.max_prompt_tokens",
    "empty_response": "explorer.generation.max_new_tokens",
    "missing_teacher": "teacher.* (the teacher cannot score)",
    "missing_student_logprobs": "the student's generation backend (student.*)",
    "length_mismatch": "student.path / teacher.path (their tokenizers)",
    "no_valid_token": "teacher.path (its vocabulary; see divopd's teacher vocabulary checks)",
}
#: The gate watch stops the run at this many × ``runtime.rejected_turns_warning`` rejected turns with no update.
REJECTED_STOP_FACTOR = 4

_NOTES: list[tuple[float, str]] = []  # (monotonic time, "stage: component — what happened"), newest last
_NOTES_LOCK = threading.Lock()
_MAX_NOTES = 16


def note_stall(stage: str, component: str, what: str) -> None:
    """Record that ``component`` stalled at ``stage`` and what was done; the watchdog's stop line names the newest."""
    with _NOTES_LOCK:
        _NOTES.append((time.monotonic(), f"stalled at {stage}: {component} ({what})"))
        del _NOTES[:-_MAX_NOTES]


def stall_notes(since: float = float("-inf")) -> list[str]:
    """The stall notes recorded at or after the monotonic time ``since``, oldest first."""
    with _NOTES_LOCK:
        return [note for t, note in _NOTES if t >= since]


@contextmanager
def timed(name: str, metrics: MutableMapping[str, float]) -> Iterator[None]:
    """Add the wall seconds of the ``with`` block to ``metrics[name]``, also when it raises."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        metrics[name] = metrics.get(name, 0.0) + (time.perf_counter() - t0)


#: Explorer-side stage times: metrics key → the :class:`~divopd.experience.turn.RolloutInfo` field that carries it.
EXPLORER_TIMES = {"time/generate_s": "generate_s", "time/env_s": "env_s", "time/score_s": "score_s"}


def add_explorer_times(rollouts: Sequence[Rollout], metrics: MutableMapping[str, float]) -> None:
    """Add the explorer seconds the arriving ``rollouts`` report (:data:`EXPLORER_TIMES`) to ``metrics``."""
    for rollout in rollouts:
        for key, field in EXPLORER_TIMES.items():
            metrics[key] = metrics.get(key, 0.0) + float(getattr(rollout.info, field))


class Watchdog:
    """Progress clock, teacher-failure streak and gate watch of one run; ``stall_timeout_s`` 0 stops no run."""

    def __init__(self, stall_timeout_s: float, batch_size: int, clock: Callable[[], float] = time.monotonic,
                 rejected_turns_warning: int = 1000) -> None:
        self.stall_timeout_s = float(stall_timeout_s)
        self.rejected_turns_warning = int(rejected_turns_warning)
        self._rejected_at_update: dict[str, int] | None = None  # the gate's counts by reason at the last update
        self._warned = False  # the gate watch's warning was given since the last update
        self.teacher_window = TEACHER_WINDOW_BATCHES * batch_size
        self._clock = clock
        self._last_progress = self._now()
        self._unscored_streak = 0  # received turns in a row without teacher log probs
        self._started = self._now() if clock is time.monotonic else float("-inf")  # notes of this run only

    def _now(self) -> float:
        return float(self._clock())

    @property
    def enabled(self) -> bool:
        return self.stall_timeout_s > 0

    def progressed(self, invalid_by_reason: Mapping[str, int]) -> None:
        """An update completed (or the loop started): the stall clock and the gate watch start again."""
        self._last_progress = self._now()
        self._warned = False
        self._rejected_at_update = {k: int(v) for k, v in invalid_by_reason.items()}

    def after_intake(self, invalid_by_reason: Mapping[str, int], version: int) -> str | None:
        """The rules checked after each intake: :meth:`teacher_failed`, then :meth:`gate_rejecting`."""
        return self.teacher_failed() or self.gate_rejecting(invalid_by_reason, version)

    def gate_rejecting(self, invalid_by_reason: Mapping[str, int], version: int) -> str | None:
        """The gate watch: a warning at ``runtime.rejected_turns_warning`` rejections since the last update, the
        reason to stop at :data:`REJECTED_STOP_FACTOR` × as many, else ``None``."""
        counts = {k: int(v) for k, v in invalid_by_reason.items()}
        if self._rejected_at_update is None:
            self._rejected_at_update = counts
            return None
        since = {k: v - self._rejected_at_update.get(k, 0) for k, v in counts.items()}
        total = sum(since.values())
        if total < self.rejected_turns_warning:
            return None
        top, n = max(since.items(), key=lambda kv: kv[1])
        what = (f"{total} turns rejected by the gate since update {version} and no update; top reason {top} ({n}), "
                f"governed by {REASON_KEYS.get(top, top)}")
        if not self._warned:
            self._warned = True
            log.warning("%s (runtime.rejected_turns_warning = %d)", what, self.rejected_turns_warning)
        if self.enabled and total >= REJECTED_STOP_FACTOR * self.rejected_turns_warning:
            return (f"stalled at the gate: {what}; no batch can be composed (runtime.rejected_turns_warning = "
                    f"{self.rejected_turns_warning}, stopped at {REJECTED_STOP_FACTOR}x)")
        return None

    def received(self, rollouts: Sequence[Rollout]) -> None:
        """Rollouts (or chunks) that entered the queue: progress; count unscored turns in a row."""
        if not rollouts:
            return
        self._last_progress = self._now()
        for rollout in rollouts:
            for turn in rollout.turns:
                self._unscored_streak = self._unscored_streak + 1 if turn.teacher_logprobs is None else 0

    def waited_s(self) -> float:
        """Seconds since the last arrival or completed update."""
        return self._now() - self._last_progress

    def stalled_waiting(self, waited_on: str) -> str | None:
        """The reason to stop when the loop has waited for rollouts too long, else ``None``."""
        if not self.enabled or self.waited_s() < self.stall_timeout_s:
            return None
        notes = stall_notes(self._started)
        seen = f"; last seen: {notes[-1]}" if notes else ""
        return (f"stalled waiting for rollouts: no rollout arrived and no update completed for "
                f"{self.waited_s():.0f} s (runtime.stall_timeout_s = {self.stall_timeout_s:g}); waited on "
                f"{waited_on}{seen}")

    def teacher_failed(self) -> str | None:
        """The reason to stop when the last ``4·B`` received turns all lack teacher scores, else ``None``."""
        if not self.enabled or self._unscored_streak < self.teacher_window:
            return None
        return (f"stalled at teacher scoring: the last {self._unscored_streak} turns received have no teacher log "
                f"probs (gate: missing_teacher; {TEACHER_WINDOW_BATCHES}·sampler.batch_size = {self.teacher_window} "
                "in a row): the teacher cannot score, no batch can be trained; see the explorers' "
                "'teacher scoring failed' warnings")
