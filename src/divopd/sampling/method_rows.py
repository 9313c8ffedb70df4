"""The method rows of the paper's tables, one record each, in display order: what every registry, config check,
report, replay, demo and doc page reads.

A *row* is what a run's ``method`` names; its record (:class:`~divopd.sampling.registry.MethodRow`) declares

- its **sampler rule** (a :class:`~divopd.sampling.registry.Method`: selection rule, gate, row weights). Most rows
  are their own rule; three read batches with another row's rule and change the run elsewhere;
- the **explorer and learner features** it switches on (:class:`~divopd.sampling.registry.Switch`, config keys):
  ``divopd-r`` teacher recovery (+R), ``tcod-f2b`` the TCOD-F2B horizon curriculum, ``turnopd`` TurnOPD's adaptive
  depth budget and its token-to-turn loss schedule (:mod:`divopd.learn.turnopd`). The training config applies them to
  the setting file (its ``method:`` picks the row) and checks them;
- its **config check** beyond the switches (``check``; no built-in row needs one);
- a description and its **tags**: ``paper`` (a row of the paper's main tables), ``coverage`` (a rule Table 11 compares
  on shared buffers), ``replay`` (the default rules of ``divopd replay``), ``demo-replay`` (the rules
  ``python -m divopd.suite.demo_replay`` and the demo's replay table compare).

Adding a row is one record here (its rule beside the others in :mod:`divopd.sampling.rules`, or in a module of its own
when it is long, like :mod:`divopd.sampling.earlier_composer`) and its test; :func:`register_method` adds a tag-less
row for a bare rule.
"""

from __future__ import annotations

from divopd.sampling.earlier_composer import compose_divopd_focus, task_balance_weights
from divopd.sampling.registry import (
    ROWS,
    Method,
    MethodRow,
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


def _rollout_first_rule(name: str, within: str, capped: bool, description: str) -> Method:
    return Method(name, rollout_first(within, capped), True, description)


#: The sampler rules that more than one row reads batches with.
VANILLA = Method("vanilla", None, False, "arrival-order reader: next B non-stale turns, no gate")
DIVOPD = _rollout_first_rule("divopd", "focus", True, "pool + gate + rollout-first cap k, focus within")

_row("vanilla", VANILLA, "arrival-order reader: the next B non-stale turns, no gate", _ALL)
_row("vanilla-pool", Method("vanilla-pool", select_oldest, True, "pool + gate, then the B oldest turns by arrival"),
     "pool + gate, then the B oldest turns by arrival", ("paper", "demo-replay"))
_row("nocap", _rollout_first_rule("nocap", "uniform", False, "pool + gate + rollout-first, k=∞, uniform within"),
     "pool + gate + rollout-first, k = ∞, uniform within", ("paper", "coverage", "demo-replay"))
_row("divopd-base", _rollout_first_rule("divopd-base", "uniform", True, "pool + gate + rollout-first cap k, uniform "
                                        "within"),
     "pool + gate + rollout-first cap k, uniform within", _ALL)
_row("divopd", DIVOPD, "pool + gate + rollout-first cap k, focus within", _ALL)
_row("divopd-focus", Method("divopd-focus", compose_divopd_focus, True,
                            "earlier composer: pool, no gate, task groups in seeded random order, 3-turn / 25%-token "
                            "first pass, task-balance row weights", gated=False, row_weights=task_balance_weights),
     "earlier composer: no gate, task groups in seeded random order, 3-turn / 25%-token first pass, task-balance row "
     "weights", ("paper",))
_row("top-b", Method("top-b", select_top_b, True, "pool + gate + Top-B: all valid turns ranked by disagreement, "
                     "no per-rollout limit"),
     "pool + gate + Top-B: all valid turns ranked by disagreement, no per-rollout limit", ("paper",))
_row("divopd-r", DIVOPD, "DivOPD + teacher recovery (+R) in no-progress rollouts", ("paper",),
     (Switch("explorer.recovery.enabled", "explorer"),))
_row("tcod-f2b", VANILLA, "arrival-order reader + TCOD-F2B rollout-depth curriculum", ("paper",),
     (Switch("tcod.enabled", "explorer"),))
_row("turnopd", VANILLA, "arrival-order reader + TurnOPD adaptive depth budget + token-to-turn loss schedule",
     ("paper",), (Switch("turnopd.enabled", "explorer"), Switch("learner.depth_stats", "learner"),
                  Switch("learner.turn_balance_updates", "learner", from_key="updates")))
