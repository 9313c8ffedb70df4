"""An observable-state expert for TextWorld-Express *twc* (``divopd sft --expert explore``, env game ``twc``).

TextWorld-Express's gold path for a one-object *twc* task reads ``look around, take O, [open C,] put O in C``. Replayed
as it is, it only ever shows the states on that path: a model cloned from it has never seen the object lying in a
wrong container, or a wrong container opened, and cannot tell what to do there (the states an on-policy student
reaches most). :func:`twc_putaway_action` takes the gold path's goal (the last ``put O in C``) and acts on the valid
actions of the current state, so it labels any state, on the path or off it:

1. ``put O in C`` when it is a valid action (the object is held and the container is open);
2. else ``open C`` when it is a valid action (the target container is closed);
3. else ``take O`` when it is a valid action (the object is on the floor, or where a wrong ``put`` left it);
4. else ``look around``.

It skips the gold path's opening ``look around`` (the first observation already describes the room), so its successes
take 2-3 steps. Only valid actions are chosen, except ``look around``, which is always valid.
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
