"""The method rows of the paper's tables, one :class:`~divopd.sampling.registry.MethodRow` each, in display order:
its sampler rule, the explorer and learner features it switches on (``divopd-r``: +R, ``tcod-f2b``: the TCOD-F2B
curriculum, ``turnopd``: TurnOPD's depth budget and loss schedule), a description and its tags (``paper``,
``coverage``: Table 11's shared-buffer rules, ``replay``: ``divopd replay``'s defaults, ``demo-replay``)."""

from __future__ import annotations

from typing import Any

from divopd.sampling.earlier_composer import compose_divopd_focus, task_balance_weights
from divopd.sampling.registry import (
    ROWS,
    Method,
    MethodRow,
    Rule,
    Switch,
    add_row,
    check_row,
    method_names,
    method_row,
    register_method,
    row_switches,
)
from divopd.sampling.rules import rollout_first, select_oldest, select_top_b

__all__ = ["MethodRow", "Switch", "ROWS", "method_names", "method_row", "add_row", "register_method", "row_switches",
           "check_row", "VANILLA", "DIVOPD"]

_ALL = ("paper", "coverage", "replay", "demo-replay")


def _row(name: str, sampler: Method, description: str, tags: tuple[str, ...] = (),
         switches: tuple[Switch, ...] = ()) -> None:
    add_row(MethodRow(name, sampler, description, frozenset(tags), switches))


def _own_row(name: str, select: Rule, description: str, tags: tuple[str, ...], **method: Any) -> Method:
    """A row that is its own pooled sampler rule, of the same name and description."""
    sampler = Method(name, select, True, description, **method)
    _row(name, sampler, description, tags)
    return sampler


#: The sampler rules that more than one row reads batches with.
VANILLA = Method("vanilla", None, False, "arrival-order reader: the next B non-stale turns, no gate")
_row("vanilla", VANILLA, VANILLA.description, _ALL)
_own_row("vanilla-pool", select_oldest, "pool + gate, then the B oldest turns by arrival", ("paper", "demo-replay"))
_own_row("nocap", rollout_first("uniform", False), "pool + gate + rollout-first, k = ∞, uniform within",
         ("paper", "coverage", "demo-replay"))
_own_row("divopd-base", rollout_first("uniform", True), "pool + gate + rollout-first cap k, uniform within", _ALL)
DIVOPD = _own_row("divopd", rollout_first("focus", True), "pool + gate + rollout-first cap k, focus within", _ALL)
_own_row("divopd-focus", compose_divopd_focus, "earlier composer: no gate, task groups in seeded random order, 3-turn "
         "/ 25%-token first pass, task-balance row weights", ("paper",), gated=False, row_weights=task_balance_weights)
_own_row("top-b", select_top_b, "pool + gate + Top-B: all valid turns ranked by disagreement, no per-rollout limit",
         ("paper",))
_row("divopd-r", DIVOPD, "DivOPD + teacher recovery (+R) in no-progress rollouts", ("paper",),
     (Switch("explorer.recovery.enabled", "explorer"),))
_row("tcod-f2b", VANILLA, "arrival-order reader + TCOD-F2B rollout-depth curriculum", ("paper",),
     (Switch("tcod.enabled", "explorer"),))
_row("turnopd", VANILLA, "arrival-order reader + TurnOPD adaptive depth budget + token-to-turn loss schedule",
     ("paper",), (Switch("turnopd.enabled", "explorer"), Switch("learner.depth_stats", "learner"),
                  Switch("learner.turn_balance_updates", "learner", from_key="updates")))
