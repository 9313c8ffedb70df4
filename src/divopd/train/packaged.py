"""The files divopd ships as package data: the setting configs and the demo's prebuilt models."""

from __future__ import annotations

from pathlib import Path

from divopd.errors import ConfigError

__all__ = ["CONFIGS", "SHIPPED", "setting_names", "config_path"]

_PACKAGE = Path(__file__).resolve().parents[1]
#: The packaged setting configs, ``<setting>.yaml``; its ``method:`` names the default method row.
CONFIGS = _PACKAGE / "configs"
#: The packaged prebuilt models, ``<setting>/{teacher,student}`` (:mod:`divopd.suite.models` copies them to the cache).
SHIPPED = _PACKAGE / "shipped"


def setting_names() -> tuple[str, ...]:
    """The names of the packaged settings, sorted."""
    return tuple(sorted(p.stem for p in CONFIGS.glob("*.yaml")))


def config_path(config: str | Path) -> Path:
    """The config file ``config`` names: an existing file, else a packaged setting (``coin6-dart``); a bare name that
    is neither raises :class:`~divopd.errors.ConfigError` listing the settings; other paths are returned as given."""
    path = Path(config)
    if path.is_file():
        return path
    text = str(config)
    if "/" in text or text.endswith((".yaml", ".yml")):
        return path
    if (CONFIGS / f"{text}.yaml").is_file():
        return CONFIGS / f"{text}.yaml"
    raise ConfigError(f"{text}: no such config file or packaged setting; settings: {', '.join(setting_names())}")
