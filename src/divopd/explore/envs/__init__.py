"""Text environments behind one protocol (:class:`divopd.explore.envs.base.Env`) and a registry (:func:`make_env`);
an environment of your own is named by its import path ``module:Class``. Adapters import their package only when
built."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from divopd.errors import ConfigError
from divopd.explore.envs.base import SPLITS, Env, EnvCrash, EnvSetupError, ProgressTracker, StepResult
from divopd.explore.envs.scienceworld import scienceworld_paper_split

__all__ = ["ENVS", "SPLITS", "Env", "EnvCrash", "EnvSetupError", "ProgressTracker", "StepResult", "check_env_name",
           "env_class", "make_env", "scienceworld_paper_split"]

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


def check_env_name(name: str) -> None:
    """Check the form of an ``explorer.env`` value without importing anything (so a run's ``config.yaml`` loads where
    its module is not installed): a registry name of :data:`ENVS`, or ``module:Class``. Raises :class:`ConfigError`."""
    if ":" in name:
        module, _, attr = name.partition(":")
        if not all(part.isidentifier() for part in module.split(".")) or not attr.isidentifier():
            raise ConfigError(f"explorer.env: {name!r} is not an import path module:Class (e.g. mypkg.envs:MyEnv)")
    elif name not in ENVS:
        raise ConfigError(f"explorer.env: unknown environment {name!r}; known: {', '.join(ENVS)}, "
                          "or an import path module:Class of an Env subclass")


def env_class(name: str) -> type[Env]:
    """The :class:`Env` subclass behind an ``explorer.env`` value, imported in this process. Raises
    :class:`ConfigError` when the module cannot be imported or does not hold such a subclass."""
    check_env_name(name)
    if ":" not in name:
        module_name, cls_name = ENVS[name]
        return getattr(importlib.import_module(module_name), cls_name)
    module_name, _, cls_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"explorer.env: cannot import {module_name!r} ({exc}); the module must be importable in "
                          "every process that builds an environment (installed, or on PYTHONPATH)") from exc
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ConfigError(f"explorer.env: module {module_name!r} has no attribute {cls_name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, Env)):
        raise ConfigError(f"explorer.env: {name!r} is not a subclass of divopd.explore.envs.Env")
    return cls


def make_env(name: str, **kwargs: Any) -> Env:
    """Build one environment by registry name or import path ``module:Class``, ``kwargs`` to its constructor. An
    unknown name, an argument the constructor does not take or a value it rejects (its ``ValueError``) is a
    :class:`divopd.errors.ConfigError`: one line and exit 2 from ``divopd train``."""
    cls = env_class(name)
    cls_name = cls.__name__
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
