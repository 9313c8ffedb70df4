"""Older config keys that still load, each with one warning line naming the key that replaced it."""

from __future__ import annotations

import logging
from typing import Any

_log = logging.getLogger("divopd.train.config")


def one_eval_tasks_key(explorer: Any, eval_settings: Any) -> None:
    """``eval.tasks`` is the one key for the held-out tasks per evaluation. The older ``explorer.eval_tasks`` still
    loads: copied into ``eval.tasks`` (ignored where that is set too) with one warning; afterwards both are equal (the
    explorer's default for ``evaluate()`` reads ``explorer.eval_tasks``)."""
    old, new = explorer.eval_tasks, eval_settings.tasks
    if "eval_tasks" in explorer.model_fields_set and old != new:
        if "tasks" in eval_settings.model_fields_set:
            _log.warning("explorer.eval_tasks is deprecated and ignored: eval.tasks = %d sets the held-out tasks per "
                         "evaluation (remove explorer.eval_tasks: %d)", new, old)
        else:
            eval_settings.tasks = old
            _log.warning("explorer.eval_tasks is deprecated: use eval.tasks (now %d)", old)
    explorer.eval_tasks = eval_settings.tasks
