"""DivOPD+R: teacher recovery for rollouts that stop making progress (paper, Section 3.4).

    Batch selection cannot help a rollout that repeatedly makes no progress. DivOPD+R therefore lets the teacher act
    for at most m turns after p no-progress turns, then returns control to the student. Teacher actions receive no
    distillation weight, subsequent student turns use the same composer, and recovery is disabled during evaluation.

Rules implemented here (the paper's Appendix G is not available; these are our reading, documented):

* A *no-progress turn* is a student turn whose env step reported ``info["progress"] == False`` (score did not rise
  above its best and no new state was reached; see :class:`divopd.explore.envs.base.ProgressTracker`).
* :func:`should_recover`: the teacher takes over once ``patience`` (p) consecutive student turns made no progress,
  provided recovery is enabled and the learner has completed at least ``warmup`` (W) updates.
* The teacher then acts for ``max_takeover`` (m) turns, fewer if the episode ends (or, with ``return_on_progress``, as
  soon as a teacher step makes progress); control returns to the student with its no-progress count reset to zero.
* Teacher turns are never queued as training rows; the rollout's info counts them (``teacher_turns``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RecoveryConfig", "RecoveryState", "should_recover"]


class RecoveryConfig(BaseModel):
    """+R settings (off by default: core DivOPD never changes the visited trajectory)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Turn teacher recovery on (the DivOPD+R method row).")
    patience: int = Field(3, ge=1, description="p: consecutive no-progress student turns that trigger a takeover.")
    max_takeover: int = Field(2, ge=1, description="m: at most this many teacher turns per takeover.")
    warmup: int = Field(0, ge=0, description="W: recovery starts once the learner has made this many updates.")
    return_on_progress: bool = Field(
        False, description="End a takeover early, right after a teacher step that makes progress.")
    teacher_greedy: bool = Field(True, description="The teacher picks its actions greedily (else samples at T=1).")


def should_recover(no_progress_streak: int, learner_version: int, config: RecoveryConfig) -> bool:
    """+R trigger: ``p`` consecutive no-progress student turns, recovery enabled, learner past its warmup ``W``."""
    return config.enabled and learner_version >= config.warmup and no_progress_streak >= config.patience


@dataclass
class RecoveryState:
    """Who acts next in one rollout, and the counts its info reports."""

    no_progress_streak: int = 0
    takeover_left: int = 0
    teacher_turns: int = 0
    takeovers: int = 0

    @property
    def teacher_in_control(self) -> bool:
        return self.takeover_left > 0

    def next_actor(self, learner_version: int, config: RecoveryConfig, evaluating: bool = False) -> str:
        """``"teacher"`` or ``"student"`` for the next turn; starts a takeover when :func:`should_recover` fires."""
        if evaluating:
            return "student"
        if not self.teacher_in_control and should_recover(self.no_progress_streak, learner_version, config):
            self.takeover_left = config.max_takeover
            self.takeovers += 1
        return "teacher" if self.teacher_in_control else "student"

    def record(self, actor: str, progress: bool, config: RecoveryConfig) -> None:
        """Account for one env step taken by ``actor`` that made (or did not make) progress."""
        if actor == "teacher":
            self.teacher_turns += 1
            self.takeover_left -= 1
            if progress and config.return_on_progress:
                self.takeover_left = 0
            if self.takeover_left == 0:
                self.no_progress_streak = 0  # control returns: the student gets a fresh patience window
        elif actor == "student":
            self.no_progress_streak = 0 if progress else self.no_progress_streak + 1
        else:
            raise ValueError(f"RecoveryState.record: actor must be 'student' or 'teacher', got {actor!r}")
