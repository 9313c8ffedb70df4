"""DivOPD+R: bounded teacher recovery for rollouts that stop making progress (paper, Section 3.4 and Appendix G):
after p consecutive no-progress student turns the teacher acts, for at most m turns per rollout. The rule and our
reading of what the paper leaves open: docs/concepts/explorers.md (+R recovery)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RecoveryConfig", "RecoveryState", "allowed_key", "is_no_progress", "normalize_action", "should_recover"]


class RecoveryConfig(BaseModel):
    """+R settings (off by default: core DivOPD never changes the visited trajectory)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Turn teacher recovery on (the DivOPD+R method row).")
    patience: int = Field(4, ge=1, description=(
        "p: consecutive no-progress student turns (an invalid action, or the previous action repeated while the set "
        "of allowed actions is unchanged) that start a takeover."))
    max_takeover: int = Field(6, ge=1, description=(
        "m: at most this many teacher turns per rollout, over all its takeovers (the paper's takeover cap)."))
    warmup: int = Field(0, ge=0, description="Recovery starts once the learner has made this many updates.")
    return_on_progress: bool = Field(False, description=(
        "End a takeover right after a teacher turn that is not a no-progress turn (the rest of the rollout's m "
        "stays for later takeovers); false: a takeover lasts until m is spent or the episode ends."))
    teacher_greedy: bool = Field(True, description="The teacher picks its actions greedily (else samples).")


def normalize_action(action: str) -> str:
    """The form actions are compared in: stripped, lower case, runs of whitespace as one space."""
    return " ".join(str(action).lower().split())


def is_no_progress(action: str, invalid: bool, allowed: Hashable, previous_action: str | None,
                   previous_allowed: Hashable) -> bool:
    """The paper's no-progress turn: an invalid action, or a repeat of ``previous_action`` while the allowed set
    (``allowed``, when this action is taken) equals ``previous_allowed`` (when the previous action was taken)."""
    if invalid:
        return True
    if previous_action is None:
        return False
    return normalize_action(action) == normalize_action(previous_action) and allowed == previous_allowed


def should_recover(no_progress_streak: int, learner_version: int, config: RecoveryConfig,
                   teacher_turns: int = 0) -> bool:
    """+R trigger: ``p`` consecutive no-progress student turns, recovery enabled, the learner past its warmup, and
    the rollout's ``m`` teacher turns not all spent (``teacher_turns`` so far)."""
    return (config.enabled and learner_version >= config.warmup and no_progress_streak >= config.patience
            and teacher_turns < config.max_takeover)


def allowed_key(allowed: Hashable | None, observation: str) -> Hashable:
    """The allowed-set key, or the observation text where the env reports no allowed actions."""
    return allowed if allowed is not None else ("observation", str(observation).strip())


@dataclass
class RecoveryState:
    """Who acts next in one rollout, what the no-progress rule compares, and the counts its info reports."""

    no_progress_streak: int = 0
    in_takeover: bool = False
    teacher_turns: int = 0
    takeovers: int = 0
    #: allowed-set key of the current state (before the next action)
    allowed: Hashable = None
    #: the previous action of the episode (any actor) and the allowed-set key when it was taken
    last_action: str | None = None
    last_allowed: Hashable = None
    #: (actor, no_progress) of every step so far
    log: list[tuple[str, bool]] = field(default_factory=list)

    def start(self, allowed: Hashable | None, observation: str = "") -> None:
        """The episode's first state: its allowed actions key (``None``: the observation text stands for it)."""
        self.allowed = allowed_key(allowed, observation)
        self.last_action, self.last_allowed = None, None

    def next_actor(self, learner_version: int, config: RecoveryConfig, evaluating: bool = False) -> str:
        """``"teacher"`` or ``"student"`` for the next turn; starts a takeover when :func:`should_recover` fires."""
        if evaluating:
            return "student"
        if self.in_takeover and self.teacher_turns >= config.max_takeover:
            self._end_takeover()
        if not self.in_takeover and should_recover(self.no_progress_streak, learner_version, config,
                                                   self.teacher_turns):
            self.in_takeover = True
            self.takeovers += 1
        return "teacher" if self.in_takeover else "student"

    def step(self, actor: str, action: str, invalid: bool, allowed_after: Hashable | None, observation: str,
             config: RecoveryConfig) -> bool:
        """Account for one env step: ``actor`` took ``action`` (``invalid`` by the env's rule), reaching a state with
        allowed actions ``allowed_after`` and ``observation``. Returns whether it was a no-progress turn."""
        no_progress = is_no_progress(action, invalid, self.allowed, self.last_action, self.last_allowed)
        self.record(actor, no_progress, config)
        self.last_action, self.last_allowed = action, self.allowed
        self.allowed = allowed_key(allowed_after, observation)
        return no_progress

    def record(self, actor: str, no_progress: bool, config: RecoveryConfig) -> None:
        """The takeover state machine for one step by ``actor`` that was (or was not) a no-progress turn."""
        if actor == "teacher":
            if not self.in_takeover:
                raise ValueError("RecoveryState.record: a teacher step outside a takeover")
            self.teacher_turns += 1
            if self.teacher_turns >= config.max_takeover or (config.return_on_progress and not no_progress):
                self._end_takeover()
        elif actor == "student":
            self.no_progress_streak = self.no_progress_streak + 1 if no_progress else 0
        else:
            raise ValueError(f"RecoveryState.record: actor must be 'student' or 'teacher', got {actor!r}")
        self.log.append((actor, no_progress))

    def _end_takeover(self) -> None:
        self.in_takeover = False
        self.no_progress_streak = 0  # control returns: the student gets a fresh patience window
