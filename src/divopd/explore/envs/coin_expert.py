"""An observable-state expert for TextWorld-Express *coin* (``divopd sft --expert explore``): the package's gold
paths know where the coin is and still wander, so a model cloned from them learns no search.
:func:`coin_explorer_action` acts on what the prompt shows only: ``take coin`` when valid; else towards an unvisited
room named in the observation; else back to the neighbour left longest ago. Only valid actions are chosen.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["coin_explorer_action", "current_room", "exits"]

_ROOM = re.compile(r"You are in the ([a-z ]+?)\.", re.IGNORECASE)
_EXIT = re.compile(r"To the (North|South|East|West) you see the ([a-z ]+?)\.", re.IGNORECASE)


def current_room(observation: str) -> str | None:
    """The room an observation places the agent in, or ``None`` when it names none (e.g. "Unknown action")."""
    m = _ROOM.search(observation)
    return m.group(1).lower() if m else None


def exits(observation: str) -> dict[str, str]:
    """``move <direction>`` → the room it leads to, as the observation names them."""
    return {f"move {d.lower()}": room.lower() for d, room in _EXIT.findall(observation)}


def coin_explorer_action(first_observation: str, history: Sequence[tuple[str, str]], valid: Sequence[str]) -> str:
    """The expert's next action given the episode so far (first observation, (action, observation) pairs)."""
    if "take coin" in valid:
        return "take coin"
    observations = [first_observation, *(obs for _, obs in history)]
    last_seen: dict[str, int] = {}  # room -> index of the last observation made in it
    here_obs = first_observation
    for i, obs in enumerate(observations):
        room = current_room(obs)
        if room is not None:
            last_seen[room] = i
            here_obs = obs
    moves = [a for a in valid if a.startswith("move ")]
    if not moves:
        return "look around" if "look around" in valid else valid[0]
    neighbours = exits(here_obs)
    fresh = [a for a in moves if a in neighbours and neighbours[a] not in last_seen]
    if fresh:
        return fresh[0]
    return min(moves, key=lambda a: (last_seen.get(neighbours.get(a, ""), -1), a))
