"""What the framework plug-ins add around the composer, shared by Trinity-RFT's strategy and verl's buffer: the
matched dispatch's bookkeeping (:mod:`divopd.integrations.dispatch`), its per-step metrics and warnings, and the
experience log of the turns the plug-in received (:mod:`divopd.integrations.plugin_log`). The settings, beside the
sampler's, are :data:`DEFAULTS` (their meanings: :mod:`divopd.integrations.plugin_keys`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from divopd.errors import UsageError
from divopd.experience import Turn
from divopd.experience.log import ExperienceLogWriter
from divopd.integrations.dispatch import TARGET_ARRIVAL_RATIO, ArrivalDispatch, check_target
from divopd.integrations.plugin_log import PluginLog
from divopd.sampling.ledger import Ledger

__all__ = ["COMPACT_EVERY", "DEFAULTS", "DEFAULT_HORIZON", "TRINITY_HINT", "PluginRun", "split_plugin_args"]

log = logging.getLogger("divopd.integrations")

#: The plug-in settings and their defaults (the sampler's own settings are the plug-in's other keys).
DEFAULTS: dict[str, Any] = {"target_arrival_ratio": TARGET_ARRIVAL_RATIO, "horizon": None, "experience_dir": None}
#: Turns per session assumed before the first one (×½), where neither ``horizon`` nor the task rows give it: the
#: horizon of the packaged ALFWorld and ScienceWorld settings.
DEFAULT_HORIZON = 30
#: Trinity-RFT's config line for the sessions per step (its strategy cannot set them).
TRINITY_HINT = "buffer.batch_size: {value} (tasks per explore step; divide it by algorithm.repeat_times)"
#: The experience log's part files are merged every this many steps (and on :meth:`PluginRun.compact`).
COMPACT_EVERY = 25


def split_plugin_args(args: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(plug-in settings with defaults, the sampler's settings)`` of a plug-in's keyword settings."""
    args = dict(args or {})
    plugin = {k: args.pop(k) for k in list(args) if k in DEFAULTS}
    return {**DEFAULTS, **plugin}, args


class PluginRun:
    """Per-step bookkeeping of one plug-in run. ``who`` and ``where`` name the plug-in and its settings in messages;
    ``config_hint`` (a format string with ``{value}``) is the config line that sets the sessions per step where the
    plug-in cannot; ``framework`` and ``run`` (its checkpoint folder) own the experience log, which :meth:`start`
    opens once the framework has said whether it resumes, or the first turn opens fresh."""

    def __init__(self, settings: Mapping[str, Any], batch_size: int, who: str, where: str,
                 config_hint: str | None = None, sessions_per_prompt: int = 1, asynchronous: bool = False,
                 framework: str = "the framework", run: str | None = None) -> None:
        self.who = who
        target = check_target(settings.get("target_arrival_ratio", TARGET_ARRIVAL_RATIO), where)
        horizon = settings.get("horizon")
        if horizon is not None and (not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1):
            raise UsageError(f"{where}.horizon: a whole number of turns >= 1, got {horizon!r}")
        self.horizon_given = horizon is not None
        self.dispatch = ArrivalDispatch(batch_size=int(batch_size), horizon=int(horizon or DEFAULT_HORIZON),
                                        target=target, sessions_per_prompt=int(sessions_per_prompt),
                                        asynchronous=asynchronous, config_hint=config_hint)
        self._expired = 0  # the ledger's expired count at the previous step
        self._backlog = 0  # turns the framework held unread at the previous step (Trinity's queue)
        directory = settings.get("experience_dir")
        self.experience = PluginLog(str(directory), where, framework, run) if directory else None

    @property
    def log_writer(self) -> ExperienceLogWriter | None:
        """The experience log's writer once it is open (``None``: no ``experience_dir``, or not started yet)."""
        return None if self.experience is None else self.experience.writer

    def start(self, resume_update: int | None = None, resume_arrival: int | None = None, next_arrival: int = 0
              ) -> None:
        """Open the experience log, fresh (no argument) or resumed from a checkpoint (:meth:`PluginLog.start
        <divopd.integrations.plugin_log.PluginLog.start>`); nothing without ``experience_dir``."""
        if self.experience is not None:
            self.experience.start(resume_update, resume_arrival, next_arrival)

    def set_horizon(self, horizon: int) -> None:
        """The env's step limit read from the task rows (unless ``horizon`` was given); before any session is back."""
        if not self.horizon_given and horizon >= 1 and self.dispatch.finished_sessions == 0:
            self.dispatch.horizon = int(horizon)

    def observe(self, rollout_ids: list[str], arrivals: list[int], learner_version: int,
                turns: Callable[[], list[Turn]] | None = None) -> None:
        """Turns the plug-in received for ``learner_version`` (their rollouts), with the sampler's arrival numbers;
        ``turns()`` gives them as divopd turns with their per-token arrays, called only for the experience log."""
        if not rollout_ids:
            return
        self.dispatch.observe(list(rollout_ids))
        if self.experience is not None and turns is not None:
            self.start(next_arrival=arrivals[0])  # a run nobody said resumes is a fresh one
            self.log_writer.extend(turns(), max(0, int(learner_version)),
                                   [a + self.experience.offset for a in arrivals])

    def step(self, ledger: Ledger, backlog: int | None = None) -> dict[str, float]:
        """Close a step: its metrics (``sampler/arrival_ratio``, ...), its warnings logged. ``backlog``: turns the
        framework holds that the plug-in has not read (their growth counts as arrived)."""
        arrived = None
        if backlog is not None:
            arrived = max(0, self.dispatch.arrived_this_step + backlog - self._backlog)
            self._backlog = backlog
        expired = int(ledger.expired)
        metrics = self.dispatch.step_metrics(expired=expired - self._expired, arrived=arrived)
        self._expired = expired
        for line in self.dispatch.warnings(self.who):
            log.warning(line)
        if self.log_writer is not None and self.dispatch.steps % COMPACT_EVERY == 0:
            self.compact()
        return metrics

    def compact(self) -> None:
        """Merge the experience log's part files (as ``divopd train`` does at a checkpoint)."""
        if self.log_writer is not None:
            self.log_writer.flush()
            self.log_writer.compact()
