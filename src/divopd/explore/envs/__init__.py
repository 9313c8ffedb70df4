"""Text environments behind one protocol (:class:`divopd.explore.envs.base.Env`) and a registry.

``make_env(name, **kwargs)`` builds one instance: ``"twx"`` (TextWorld-Express, the CPU demo's default),
``"scienceworld"`` and ``"tiny"`` (pure Python, for fast tests). Adapters import their package only when built.

:func:`scienceworld_paper_split` is the paper's ScienceWorld split (2,294 training / 1,308 held-out instances of
disjoint task types); ``make_env("scienceworld", split_scheme="paper")`` lists it as the ``train`` / ``test`` splits.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from divopd.errors import ConfigError
from divopd.explore.envs.base import SPLITS, Env, EnvCrash, ProgressTracker, StepResult
from divopd.explore.envs.scienceworld import scienceworld_paper_split

__all__ = ["ENVS", "SPLITS", "Env", "EnvCrash", "ProgressTracker", "StepResult", "make_env",
           "scienceworld_paper_split"]

#: registry name -> (module, class name)
ENVS: dict[str, tuple[str, str]] = {
    "twx": ("divopd.explore.envs.twx", "TextWorldExpressEnv"),
    "textworld-express": ("divopd.explore.envs.twx", "TextWorldExpressEnv"),
    "scienceworld": ("divopd.explore.envs.scienceworld", "ScienceWorldEnv"),
    "tiny": ("divopd.explore.envs.tiny", "TinyEnv"),
    "webshop": ("divopd.explore.envs.webshop", "WebShopEnv"),
    "webshop-offline": ("divopd.explore.envs.webshop", "OfflineWebShopEnv"),
    "alfworld": ("divopd.explore.envs.alfworld", "AlfWorldEnv"),
}


def make_env(name: str, **kwargs: Any) -> Env:
    """Build one environment instance by registry name; ``kwargs`` go to the adapter's constructor.

    An unknown name, an argument the constructor does not take, or a value it rejects (its ``ValueError``) is a
    :class:`divopd.errors.ConfigError` (a ``ValueError``): ``explorer.env`` / ``explorer.env_kwargs`` of a config come
    here, so ``divopd train`` reports them on one line and exits 2.
    """
    if name not in ENVS:
        raise ConfigError(f"make_env: unknown environment {name!r}; expected one of {sorted(ENVS)}")
    module_name, cls_name = ENVS[name]
    cls = getattr(importlib.import_module(module_name), cls_name)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"environment {name!r} ({cls_name}): bad env_kwargs {sorted(kwargs)}: {exc}") from exc
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"environment {name!r}: {exc}") from exc
