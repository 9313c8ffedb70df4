"""The producer matched to the composer: how many rollout sessions a framework starts per trainer step.

:class:`ArrivalDispatch` keeps a step's arrival ratio (turns arrived since the previous step ÷ B) near ρ*
(``target_arrival_ratio``) by starting s = ρ*·B / m sessions per step, m = the running mean of turns per finished
session (:func:`start_turns_per_session` before the first); asynchronous: s·(1 + lag) − in flight. Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from divopd.errors import UsageError

__all__ = ["TARGET_ARRIVAL_RATIO", "ArrivalDispatch", "check_target", "sessions_per_step", "start_turns_per_session"]

#: ρ*: turns generated and teacher-scored per trained turn (the paper's pool regime is about 1.5–2).
TARGET_ARRIVAL_RATIO = 2.0
#: Steps whose mean ratio the out-of-band warning judges (a framework without a dispatch lever).
CHECK_STEPS = 3
#: Rollout ids remembered to count a session once when its turns are read in parts.
SEEN_LIMIT = 100_000
#: A starved warning is repeated at most every this many steps while it lasts.
STARVED_EVERY = 50


def check_target(value: object, where: str) -> float:
    """``target_arrival_ratio`` as a float ≥ 1 (one line naming ``where`` otherwise)."""
    try:
        ratio = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UsageError(f"{where}.target_arrival_ratio: a number >= 1, got {value!r}") from None
    if not math.isfinite(ratio) or ratio < 1:
        raise UsageError(f"{where}.target_arrival_ratio: a number >= 1 (turns generated per trained turn), got "
                         f"{value!r}")
    return ratio


def start_turns_per_session(horizon: int) -> float:
    """The mean turns per session assumed before any session finished: half the horizon (at least 1)."""
    return max(1.0, horizon / 2)


def sessions_per_step(target: float, batch_size: int, turns_per_session: float) -> int:
    """s = ⌈ρ* · B / m⌉: the sessions that bring about ρ*·B turns per step when a session yields m turns."""
    return max(1, math.ceil(target * batch_size / max(turns_per_session, 1e-9) - 1e-9))


@dataclass
class ArrivalDispatch:
    """The rule, and its per-step bookkeeping (``horizon``: the env's step limit, for the start value)."""

    batch_size: int
    horizon: int
    target: float = TARGET_ARRIVAL_RATIO
    sessions_per_prompt: int = 1
    asynchronous: bool = False
    config_hint: str | None = None  # the config line that sets the sessions, with {value}: "buffer.batch_size: {value}"
    finished_sessions: int = 0
    finished_turns: int = 0
    in_flight: int = 0
    started_total: int = 0
    steps: int = 0
    _lag_sum: float = 0.0
    _started_at: list[tuple[int, int]] = field(default_factory=list)  # (step, sessions) still out, oldest first
    _ratios: list[float] = field(default_factory=list)
    _last_starved: int | None = None
    _band_warned: bool = False
    _started_this_step: int = 0
    arrived_this_step: int = 0  # turns observe() saw since the previous step closed
    _owed: float = 0.0
    _seen: dict[str, None] = field(default_factory=dict)  # rollout ids observed (the newest SEEN_LIMIT), in order

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.horizon < 1 or self.sessions_per_prompt < 1:
            raise UsageError(f"dispatch: batch_size, horizon and sessions per prompt must be >= 1, got "
                             f"{self.batch_size}, {self.horizon}, {self.sessions_per_prompt}")
        self.target = check_target(self.target, "dispatch")

    # ------------------------------------------------------------------ the rule
    @property
    def turns_per_session(self) -> float:
        """m: the running mean of turns per finished session, or the start value before the first one."""
        if self.finished_sessions == 0:
            return start_turns_per_session(self.horizon)
        return self.finished_turns / self.finished_sessions

    @property
    def ratios(self) -> list[float]:
        """The arrival ratio of every step closed so far."""
        return list(self._ratios)

    @property
    def rollouts_observed(self) -> int:
        """Distinct rollouts whose turns arrived (the newest :data:`SEEN_LIMIT` remembered)."""
        return len(self._seen)

    @property
    def lag(self) -> float:
        """Mean steps a finished session was out (0 in synchronous mode)."""
        if not self.asynchronous or self.finished_sessions == 0:
            return 0.0
        return self._lag_sum / self.finished_sessions

    def _wanted(self) -> float:
        """Sessions wanted now, unrounded: ρ*·B/m · (1 + lag) − in flight, plus the fraction owed from before."""
        return self.target * self.batch_size / self.turns_per_session * (1 + self.lag) - self.in_flight + self._owed

    def sessions_to_start(self) -> int:
        """Sessions to start now: s·(1 + lag) minus those still in flight, at least 0. The fraction a whole number
        of sessions leaves is owed to the next step, so the mean ratio meets ρ* rather than rounding above it."""
        return max(0, math.floor(self._wanted() + 1e-9))

    def prompts_to_submit(self) -> int:
        """⌈sessions to start / sessions per prompt⌉ (``rollout.n``)."""
        return math.ceil(self.sessions_to_start() / self.sessions_per_prompt)

    def suggested_prompts_per_step(self) -> int:
        """⌈s / sessions per prompt⌉: the value of a framework's static config line (Trinity's ``buffer.batch_size``,
        tasks per explore step, each run ``repeat_times`` times)."""
        s = sessions_per_step(self.target, self.batch_size, self.turns_per_session)
        return math.ceil(s / self.sessions_per_prompt)

    # ------------------------------------------------------------------ bookkeeping
    def started(self, sessions: int) -> None:
        """``sessions`` were started during the current step."""
        self._owed = max(-float(self.sessions_per_prompt), min(1.0, self._wanted() - sessions))
        if sessions > 0:
            self.in_flight += sessions
            self.started_total += sessions
            self._started_this_step += sessions
            self._started_at.append((self.steps, sessions))

    def observe(self, rollout_ids: list[str]) -> None:
        """Turns arrived, one rollout id per turn. A rollout id seen for the first time is a session that came back
        (its turns arrive together at its end); m = turns observed ÷ sessions observed, so a session whose turns are
        read in two parts still counts once."""
        new = [rid for rid in dict.fromkeys(rollout_ids) if rid not in self._seen]
        self._seen.update(dict.fromkeys(new))
        while len(self._seen) > SEEN_LIMIT:
            self._seen.pop(next(iter(self._seen)))
        self.finished_sessions += len(new)
        self.finished_turns += len(rollout_ids)
        self.arrived_this_step += len(rollout_ids)
        for _ in new:
            if self._started_at:
                step, left = self._started_at[0]
                self._lag_sum += self.steps - step
                self._started_at[0] = (step, left - 1)
                if left <= 1:
                    self._started_at.pop(0)
        self.in_flight = max(0, self.in_flight - len(new))

    def step_metrics(self, expired: int, arrived: int | None = None, sessions_started: int | None = None
                     ) -> dict[str, float]:
        """Close a step: ``expired`` turns expired at it; ``arrived`` (default: the turns :meth:`observe` saw since
        the previous step) came in; ``sessions_started`` overrides the count :meth:`started` gathered."""
        self.steps += 1
        started = self._started_this_step if sessions_started is None else sessions_started
        arrived = self.arrived_this_step if arrived is None else arrived
        self._started_this_step = self.arrived_this_step = 0
        ratio = arrived / self.batch_size
        self._ratios.append(ratio)
        return {"sampler/arrival_ratio": ratio, "sampler/sessions_started": float(started),
                "sampler/turns_per_session": self.turns_per_session,
                "sampler/expired_share": expired / arrived if arrived else 0.0}

    def warnings(self, who: str) -> list[str]:
        """One-line warnings for the step just closed: a starved step (ratio < 1), and where ``config_hint`` is set, a
        mean ratio outside [ρ*/2, 2ρ*] over the first steps naming the config value to set; empty when none is due."""
        out = []
        ratio = self._ratios[-1] if self._ratios else None
        if ratio is not None and ratio < 1 and self.steps > 1 and (
                self._last_starved is None or self.steps - self._last_starved >= STARVED_EVERY):
            self._last_starved = self.steps
            out.append(f"{who}: step {self.steps}: {ratio * self.batch_size:.0f} turns arrived for B = "
                       f"{self.batch_size} (arrival ratio {ratio:.2f} < 1): the composer is starved and waits; "
                       f"start more sessions per step (target_arrival_ratio {self.target:g})")
        if self.config_hint and not self._band_warned and len(self._ratios) == CHECK_STEPS + 1:
            self._band_warned = True
            mean = sum(self._ratios[1:]) / CHECK_STEPS  # step 1 has no arrivals before it in a cold start
            if not self.target / 2 <= mean <= 2 * self.target:
                out.append(f"{who}: arrival ratio {mean:.2f} over steps 2-{CHECK_STEPS + 1}, outside "
                           f"[{self.target / 2:g}, {2 * self.target:g}] (target_arrival_ratio {self.target:g}, "
                           f"{self.turns_per_session:.1f} turns per session): set "
                           + self.config_hint.format(value=self.suggested_prompts_per_step()))
        return out
