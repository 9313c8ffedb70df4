# ruff: noqa
"""The previous sampler's registry module, kept as the test oracle (docstrings dropped)."""
from __future__ import annotations
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
import numpy as np
from divopd.experience.turn import Turn
Entry = tuple[int, Turn]
Composer = Callable[[list[Entry], int, Any, np.random.Generator], list[Entry]]
Selector = Callable[[dict[int, Turn], Any, int, Any, np.random.Generator], np.ndarray]

@dataclass(frozen=True)
class Method:
    name: str
    compose: Composer | None
    pooled: bool
    description: str
    select: Selector | None = None
    gated: bool = True
    row_weights: Callable[[list[Turn]], list[float]] | None = None
METHODS: dict[str, Method] = {}

def get_method(name: str) -> Method:
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"unknown sampler method {name!r}; known: {', '.join(sorted(METHODS))}")
    return method
