"""An observable-state expert for TextWorld-Express *twc* (``divopd sft --expert explore``): the package's gold path
shows only its own states. :func:`twc_putaway_action` labels any state towards the gold path's goal (its last ``put O
in C``): ``put O in C``, else ``open C``, else ``take O``, else ``look around``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["putaway_goal", "twc_putaway_action"]

_PUT = re.compile(r"^put (.+) in (.+)$")


def putaway_goal(gold: Sequence[str]) -> tuple[str, str]:
    """``(object, container)`` of a gold path's last ``put O in C``; ``ValueError`` when the path has none."""
    for action in reversed(gold):
        m = _PUT.match(action)
        if m:
            return m.group(1), m.group(2)
    raise ValueError(f"no 'put ... in ...' action in the gold path {list(gold)!r}")


def twc_putaway_action(goal: tuple[str, str], valid: Sequence[str]) -> str:
    """The expert's next action towards ``goal`` = ``(object, container)`` given the state's valid actions."""
    obj, container = goal
    for action in (f"put {obj} in {container}", f"open {container}", f"take {obj}"):
        if action in valid:
            return action
    return "look around"
