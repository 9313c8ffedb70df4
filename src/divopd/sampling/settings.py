"""The sampler's settings, declared once (name, type, default, bound, meaning, CLI flag): :class:`SamplerConfig`
validates against the table, the training config's ``sampler:`` section and the ``divopd replay`` / ``tune-cap`` flags
are generated from it. The method and the seed are not here: a run names them at its top level."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["Setting", "SAMPLER_SETTINGS", "CAP_UNITS", "GROUP_ORDERS", "validate_setting", "add_sampler_flags",
           "sampler_kwargs", "settings_from_args", "settings_model"]

CAP_UNITS = ("turns", "tokens")
GROUP_ORDERS = ("first-seen",)


@dataclass(frozen=True)
class Setting:
    """One sampler setting. ``kind``: ``int``, ``float``, ``optional-int`` or ``choice`` (of ``choices``)."""

    name: str
    kind: str
    default: Any
    description: str
    symbol: str = ""  # the paper's symbol (B, c, k, δ), shown in --help
    minimum: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SAMPLER_SETTINGS: tuple[Setting, ...] = (
    Setting("batch_size", "int", 32, "B: rows per learner update.", "B", minimum=1),
    Setting("pool_factor", "float", 4, "c: pooled methods inspect up to c·B pending + fresh turns.", "c", minimum=1),
    Setting("cap", "int", 4, "k: first-pass per-rollout cap of rollout-first methods.", "k", minimum=1),
    Setting("max_staleness", "int", 2, "δ: turns with learner − policy version above this expire.", "δ", minimum=0),
    Setting("max_pending", "optional-int", None, "Keep at most this many unselected valid turns (none = no limit).",
            minimum=0),
    Setting("cap_unit", "choice", "turns", "Cap counts turns (paper) or token share (beyond the paper).",
            choices=CAP_UNITS),
    Setting("max_pending_age", "optional-int", 8, "W: unselected valid turns first seen more than W updates ago "
            "expire (Algorithm 1, step 8; none = no age limit).", "W", minimum=0),
    Setting("group_order", "choice", "first-seen", "Rollout groups are visited by their oldest first-seen update, "
            "ties by rollout id (Algorithm 1, step 4).", choices=GROUP_ORDERS),
)


def validate_setting(setting: Setting, value: Any, owner: str) -> None:
    """Raise ``ValueError`` naming ``owner.setting`` when ``value`` is not a valid value of ``setting``."""
    where = f"{owner}.{setting.name}"
    if setting.kind == "choice":
        if value not in setting.choices:
            raise ValueError(f"{where} must be one of {setting.choices}, got {value!r}")
    elif setting.kind == "float":
        if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
                or not math.isfinite(value) or value < setting.minimum):
            raise ValueError(f"{where} must be a number >= {setting.minimum:g}, got {value!r}")
    elif value is not None or setting.kind != "optional-int":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < setting.minimum:
            raise ValueError(f"{where} must be an int >= {setting.minimum:g}, got {value!r}")


def sampler_kwargs(source: Any) -> dict[str, Any]:
    """Every sampler setting of ``source`` (an object with the attributes, or a mapping), by name."""
    if isinstance(source, Mapping):
        return {s.name: source[s.name] for s in SAMPLER_SETTINGS if s.name in source}
    return {s.name: getattr(source, s.name) for s in SAMPLER_SETTINGS}


def _parse_optional_int(text: str) -> int | None:
    return None if text.lower() in ("none", "") else int(text)


def add_sampler_flags(parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None,
                      skip: tuple[str, ...] = ()) -> None:
    """Add one flag per setting (``--batch-size``, ``--pool-factor``, ...), with tool-specific ``defaults``."""
    defaults = dict(defaults or {})
    for s in SAMPLER_SETTINGS:
        if s.name in skip:
            continue
        default = defaults.get(s.name, s.default)
        label = f"{s.symbol}: " if s.symbol and not s.description.startswith(f"{s.symbol}:") else ""
        help_text = f"{label}{s.description} (default {'none' if default is None else default})"
        if s.kind == "choice":
            parser.add_argument(s.flag, choices=s.choices, default=default, help=help_text)
        else:
            kind = {"int": int, "float": float, "optional-int": _parse_optional_int}[s.kind]
            parser.add_argument(s.flag, type=kind, default=default, help=help_text)


def settings_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The values of the flags :func:`add_sampler_flags` added (``pool_factor`` 4.0 is given as 4)."""
    out = {s.name: getattr(args, s.name) for s in SAMPLER_SETTINGS if s.name not in skip}
    if isinstance(out.get("pool_factor"), float) and out["pool_factor"].is_integer():
        out["pool_factor"] = int(out["pool_factor"])
    return out


def settings_model(base: type) -> type:
    """The pydantic model of the settings (the training config's ``sampler:`` section), subclassing ``base``."""
    from pydantic import Field, create_model

    fields: dict[str, Any] = {}
    for s in SAMPLER_SETTINGS:
        ge = {"ge": s.minimum} if s.minimum is not None else {}
        annotation: Any = {"int": int, "float": float, "optional-int": int | None}.get(s.kind)
        if s.kind == "choice":
            annotation = Literal[s.choices]  # type: ignore[valid-type]
        fields[s.name] = (annotation, Field(s.default, description=s.description, **ge))
    return create_model("SamplerSettings", __base__=base,
                        __doc__="Batch selection (the method comes from the top-level ``method``; the seed from "
                                "``seed``). Generated from divopd.sampling.settings.", **fields)
