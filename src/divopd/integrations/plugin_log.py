"""The framework plug-ins' experience log (``experience_dir``): opened for a fresh run, or continued, cut back to the
checkpoint (:func:`~divopd.experience.log.truncate_log`), for the run the framework resumes. divopd writes there only
its marker and its log's part files, and truncates a log only where the marker names the run being resumed.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from divopd.errors import UsageError, one_line
from divopd.experience.log import (
    PART_PATTERN,
    ExperienceLogError,
    ExperienceLogWriter,
    first_arrival_at_update,
    set_aside_unreadable_parts,
    truncate_log,
)

__all__ = ["MARKER", "PluginLog"]

log = logging.getLogger("divopd.integrations")

#: The marker file a plug-in writes into its ``experience_dir``: JSON ``{"framework": ..., "run": ...}``, ``run``
#: the framework's checkpoint folder of the run that writes the log (``null`` where the plug-in cannot see it).
MARKER = ".divopd-plugin-log"


def _ours(name: str) -> bool:
    """A name divopd's directory log uses: the marker, a part, a part being written, a part set aside unreadable."""
    for suffix in (".tmp", ".unreadable"):
        name = name.removesuffix(suffix)
    return name == MARKER or PART_PATTERN.match(name) is not None


class PluginLog:
    """The experience log of one plug-in run in ``directory``; ``where`` and ``framework`` name the settings and the
    framework in the one-line messages, ``run`` the framework's checkpoint folder of this run (``None``: unknown).

    Construction raises :class:`~divopd.errors.UsageError` for a file, files divopd did not write, or another run's
    log; :meth:`start` opens the writer once the framework has said whether it resumes."""

    def __init__(self, directory: str | os.PathLike, where: str, framework: str, run: str | None = None) -> None:
        self.path = Path(directory)
        self.where, self.framework, self.run = where, framework, run
        self.writer: ExperienceLogWriter | None = None
        self.offset = 0  # added to the sampler's arrival numbers: a resumed run's sampler may number from 0 again
        self.truncated = 0  # rows dropped from the earlier session's log (past the checkpoint resumed from)
        self.held = self._check()  # the directory holds this run's log from an earlier session

    def refusal(self) -> UsageError:
        """The one line of a fresh run whose ``experience_dir`` holds a log it cannot continue."""
        return UsageError(f"{self.where}.experience_dir {str(self.path)!r}: already holds an earlier run's experience "
                          f"log, and {self.framework} is not resuming that run from a checkpoint; give this run a new "
                          f"experience_dir, or remove {self.path} to start over")

    def _check(self) -> bool:
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"{self.where}.experience_dir {str(self.path)!r}: exists and is not a directory")
        names = sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []
        foreign = [n for n in names if not _ours(n)]
        if foreign:
            raise UsageError(f"{self.where}.experience_dir {str(self.path)!r}: holds files divopd did not write "
                             f"({', '.join(foreign[:3])}); give this run a new or empty experience_dir")
        if not any(n != MARKER for n in names):
            return False  # empty, or a marker alone: no turn was ever logged there
        if self.run is None or self._marked_run() != self.run:
            raise self.refusal()
        return True

    def _marked_run(self) -> str | None:
        try:
            return json.loads((self.path / MARKER).read_text()).get("run")
        except (OSError, ValueError, AttributeError):
            return None

    def start(self, resume_update: int | None = None, resume_arrival: int | None = None, next_arrival: int = 0
              ) -> None:
        """Open the log (once). A resumed run gives the point it resumes from: ``resume_update``, the learner version
        of the framework's checkpoint (rows logged at that update or later go), or ``resume_arrival``, the restored
        sampler's next arrival number (rows from it on go); ``next_arrival`` is the sampler's next arrival number now.
        A fresh run (neither given) in a directory that holds this run's earlier log is refused (:meth:`refusal`)."""
        if self.writer is not None:
            return
        resuming = resume_update is not None or resume_arrival is not None
        if self.held and not resuming:
            raise self.refusal()
        where, directory = self.where, str(self.path)
        try:
            if self.held:
                set_aside_unreadable_parts(self.path)
                cut = resume_arrival if resume_arrival is not None else first_arrival_at_update(self.path,
                                                                                                resume_update)
                self.truncated = 0 if cut is None else truncate_log(self.path, cut)
            writer = ExperienceLogWriter(self.path)
            (self.path / MARKER).write_text(json.dumps({"framework": self.framework, "run": self.run}) + "\n")
        except (OSError, ValueError, ExperienceLogError) as exc:
            raise UsageError(f"{where}.experience_dir {directory!r}: cannot write the experience log there "
                             f"({one_line(exc, 200)})") from None
        if self.held:
            log.info("%s: resuming the experience log in %s: %d turns logged past the checkpoint removed, the log "
                     "goes on from arrival %d", self.where, directory, self.truncated, writer.next_arrival)
        self.writer = writer
        self.offset = max(0, writer.next_arrival - int(next_arrival))
