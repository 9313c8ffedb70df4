"""The method registry: sampler rules (:class:`Method`, :data:`METHODS`) and the paper's method rows
(:class:`MethodRow`, :data:`ROWS`), filled by :mod:`divopd.sampling.method_rows`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from divopd.sampling.candidate import Columns

__all__ = ["RuleSettings", "Rule", "Method", "Switch", "MethodRow", "METHODS", "ROWS", "add_row",
           "register_method", "get_method", "method_names", "method_row", "row_switches", "check_row"]


class RuleSettings(Protocol):
    """The settings a selection rule reads (a :class:`~divopd.sampling.SamplerConfig` has them all)."""

    batch_size: int
    cap: int
    cap_unit: str
    group_order: str


#: A selection rule: ``(pool, batch_size, settings, rng) -> positions`` of ``batch_size`` distinct pool rows, in
#: composition order. ``pool`` holds the gated, non-stale candidates in arrival order.
Rule = Callable[[Columns[Any], int, RuleSettings, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class Method:
    """A batch-selection rule (what ``SamplerConfig.method`` names). ``select`` is ``None`` for the arrival-order
    reader (not ``pooled``); a pooled rule reads a candidate pool of ``c·B`` turns, gated unless ``gated`` is False
    (``divopd-focus``). ``row_weights`` maps the selected rows to loss weights (mean 1; ``None``: the paper's loss)."""

    name: str
    select: Rule | None
    pooled: bool
    description: str
    gated: bool = True
    row_weights: Callable[[Columns[Any]], list[float]] | None = None


@dataclass(frozen=True)
class Switch:
    """A feature a method row switches on: config key ``key`` set to ``value``, or, with ``from_key``, to the value of
    another key of the setting file (TurnOPD's ``learner.turn_balance_updates`` = the setting's ``updates``)."""

    key: str
    side: Literal["explorer", "learner"]
    value: Any = True
    from_key: str | None = None


@dataclass(frozen=True)
class MethodRow:
    """One method row of the paper's tables (what a run's ``method`` names): its sampler rule (rows may share one),
    description, tags, the features it switches on, and an extra config check ``check(get) -> problem or None``."""

    name: str
    sampler: Method
    description: str
    tags: frozenset[str] = field(default_factory=frozenset)
    switches: tuple[Switch, ...] = ()
    check: Callable[[Callable[[str], Any]], str | None] | None = None

    @property
    def rule(self) -> str:
        """The sampler rule's name (``divopd-r`` → ``divopd``)."""
        return self.sampler.name

    @property
    def explorer(self) -> str:
        """What the row changes beyond the sampler, e.g. ``explorer.recovery.enabled`` ("" = nothing)."""
        return ", ".join(f"{s.key}" for s in self.switches)


#: Sampler rules by name (filled by :mod:`divopd.sampling.method_rows` and by :func:`register_method`).
METHODS: dict[str, Method] = {}
#: Every method row, in display order (insertion order).
ROWS: dict[str, MethodRow] = {}


def add_row(row: MethodRow) -> MethodRow:
    """Register a row (after the existing ones in display order) and, when new, its sampler rule."""
    if not row.name or not isinstance(row.name, str):
        raise ValueError("method name must be a non-empty str")
    if row.name in ROWS:
        raise ValueError(f"method row {row.name!r} is already registered")
    known = METHODS.get(row.sampler.name)
    if known is not None and known is not row.sampler:
        raise ValueError(f"method {row.sampler.name!r} is already registered")
    METHODS[row.sampler.name] = row.sampler
    ROWS[row.name] = row
    return row


def register_method(name: str, select: Rule, description: str = "") -> Method:
    """Register a pooled rule under ``name``, with a tag-less row of the same name (a row with tags or switches is a
    :class:`MethodRow` given to :func:`add_row`)."""
    if not name or not isinstance(name, str):
        raise ValueError("method name must be a non-empty str")
    stale = ROWS.get(name)
    if name in METHODS or (stale is not None and stale.rule in METHODS):
        raise ValueError(f"method {name!r} is already registered")
    method = Method(name=name, select=select, pooled=True, description=description)
    METHODS[name] = method
    ROWS[name] = MethodRow(name, method, description)  # a stale row (its rule taken out of METHODS) keeps its place
    return method


def get_method(name: str) -> Method:
    """The registered sampler rule called ``name``; ``ValueError`` naming the known rules otherwise."""
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"unknown sampler method {name!r}; known: {', '.join(sorted(METHODS))}")
    return method


def method_names(tag: str | None = None) -> tuple[str, ...]:
    """Row names in display order, all or those with ``tag``, leaving out rows whose rule left :data:`METHODS`."""
    return tuple(name for name, row in ROWS.items() if (tag is None or tag in row.tags) and row.rule in METHODS)


def method_row(name: str) -> MethodRow:
    """The row called ``name``; ``ValueError`` naming the known rows otherwise."""
    if name not in ROWS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(ROWS)}")
    return ROWS[name]


def _lookup(mapping: Mapping[str, Any], key: str) -> Any:
    node: Any = mapping
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def row_switches(row: MethodRow, setting: Mapping[str, Any]) -> dict[str, Any]:
    """The row's switches as a nested mapping to merge over a setting file's mapping ``setting``. A ``from_key`` switch
    fills its key only where ``setting`` leaves it unset (a run's saved ``config.yaml`` keeps its own value)."""
    out: dict[str, Any] = {}
    for s in row.switches:
        if s.from_key is not None and _lookup(setting, s.key) is not None:
            continue
        value = _lookup(setting, s.from_key) if s.from_key is not None else s.value
        node = out
        *parents, leaf = s.key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def check_row(row: MethodRow, get: Callable[[str], Any]) -> str | None:
    """The first problem of a config for ``row`` (``get``: dotted key -> value), or ``None``: every switch of the row
    must be on (a ``from_key`` switch: set at all), then the row's own ``check``."""
    for s in row.switches:
        value = get(s.key)
        if s.from_key is not None:
            if value is None:
                return f"method {row.name} needs {s.key} (e.g. the run's {s.from_key})"
        elif value != s.value:
            return f"method {row.name} needs {s.key}: {json.dumps(s.value)}"
    return row.check(get) if row.check is not None else None
