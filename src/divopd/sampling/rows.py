"""The method rows of the paper's tables, in display order: the one list every report, replay and demo reads.

A *row* is what a run's ``method`` names. Most rows are a sampler rule of :data:`~divopd.sampling.METHODS`; three
change the explorer (and the loss) instead and read batches with another rule (``divopd-r``: the ``divopd`` sampler +
teacher recovery; ``tcod-f2b``: the ``vanilla`` reader + TCOD-F2B horizons; ``turnopd``: the ``vanilla`` reader +
TurnOPD's adaptive depth budget and turn-balanced loss schedule, :mod:`divopd.learn.turnopd`). Tags say which lists a
row belongs to:

- ``paper``: a row of the paper's main tables;
- ``coverage``: a rule Table 11 compares on shared buffers (``divopd bench``'s coverage report);
- ``replay``: the default rules of ``divopd replay``;
- ``demo-replay``: the rules ``python -m divopd.suite.demo_replay`` and the demo's replay table compare.

:func:`register_method` adds a row for a new rule (tag-less, after the built-in rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from divopd.sampling.methods import METHODS

__all__ = ["MethodRow", "ROWS", "method_names", "method_row", "add_row"]


@dataclass(frozen=True)
class MethodRow:
    """One method row: its name, the sampler rule it reads batches with, a description and its tags."""

    name: str
    rule: str
    description: str
    tags: frozenset[str] = field(default_factory=frozenset)
    explorer: str = ""  # what the row changes on the explorer side ("" = nothing)


#: Every row, in display order (insertion order).
ROWS: dict[str, MethodRow] = {}


def add_row(name: str, rule: str, description: str, tags: tuple[str, ...] = (), explorer: str = "") -> MethodRow:
    """Append a row (after the existing ones in display order)."""
    if name in ROWS:
        raise ValueError(f"method row {name!r} is already registered")
    row = MethodRow(name, rule, description, frozenset(tags), explorer)
    ROWS[name] = row
    return row


def method_names(tag: str | None = None) -> tuple[str, ...]:
    """Row names in display order, all of them or those with ``tag`` (rows whose rule is no longer registered in
    :data:`~divopd.sampling.METHODS` are left out)."""
    return tuple(name for name, row in ROWS.items() if (tag is None or tag in row.tags) and row.rule in METHODS)


def method_row(name: str) -> MethodRow:
    """The row called ``name``; ``ValueError`` naming the known rows otherwise."""
    if name not in ROWS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(ROWS)}")
    return ROWS[name]


add_row("vanilla", "vanilla", "arrival-order reader: the next B non-stale turns, no gate",
        ("paper", "coverage", "replay", "demo-replay"))
add_row("vanilla-pool", "vanilla-pool", "pool + gate, then the B oldest turns by arrival", ("paper", "demo-replay"))
add_row("nocap", "nocap", "pool + gate + rollout-first, k = ∞, uniform within",
        ("paper", "coverage", "demo-replay"))
add_row("divopd-base", "divopd-base", "pool + gate + rollout-first cap k, uniform within",
        ("paper", "coverage", "replay", "demo-replay"))
add_row("divopd", "divopd", "pool + gate + rollout-first cap k, focus within",
        ("paper", "coverage", "replay", "demo-replay"))
add_row("divopd-focus", "divopd-focus", "earlier composer: no gate, task groups in seeded random order, 3-turn / "
        "25%-token first pass, task-balance row weights", ("paper",))
add_row("top-b", "top-b", "pool + gate + Top-B: all valid turns ranked by disagreement, no per-rollout limit",
        ("paper",))
add_row("divopd-r", "divopd", "DivOPD + teacher recovery (+R) in no-progress rollouts", ("paper",),
        explorer="+R: explorer.recovery.enabled")
add_row("tcod-f2b", "vanilla", "arrival-order reader + TCOD-F2B rollout-depth curriculum", ("paper",),
        explorer="TCOD-F2B horizon: tcod.enabled")
add_row("turnopd", "vanilla", "arrival-order reader + TurnOPD adaptive depth budget + token-to-turn loss schedule",
        ("paper",), explorer="TurnOPD depth budget: turnopd.enabled (+ learner.turn_balance_updates)")
