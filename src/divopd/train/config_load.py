"""From text to a config mapping: YAML files (following ``base:``), a method row's switches, ``--set`` overrides;
an unknown key is named where it was written, with the closest valid key. The schema is passed in as ``schema``."""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from divopd.errors import ConfigError, describe_yaml_error, read_yaml_mapping
from divopd.sampling import ROWS
from divopd.sampling.registry import row_switches

__all__ = ["apply_overrides", "closest_key", "deep_merge", "override_for", "read_yaml", "schema_keys", "unknown_key",
           "unknown_key_line", "with_method"]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys put in, section by section (copies; neither argument changes)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The config section type of a field (``Model`` or ``Model | None``), ``None`` for a value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, UnionType):
        return next((a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return None


def unknown_key(schema: type[BaseModel], data: dict[str, Any], prefix: str = "") -> str | None:
    """The first dotted key of ``data`` that ``schema`` lacks (free-form mappings allow any), else ``None``."""
    for key, value in data.items():
        field = schema.model_fields.get(key)
        if field is None:
            return f"{prefix}{key}"
        section = _submodel(field.annotation)
        if section is not None and isinstance(value, dict):
            found = unknown_key(section, value, f"{prefix}{key}.")
            if found is not None:
                return found
    return None


def schema_keys(schema: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``schema``, sections included (``sampler``, ``sampler.cap``, ...)."""
    keys = []
    for name, field in schema.model_fields.items():
        keys.append(f"{prefix}{name}")
        section = _submodel(field.annotation)
        if section is not None:
            keys += schema_keys(section, f"{prefix}{name}.")
    return keys


def closest_key(schema: type[BaseModel], key: str) -> str | None:
    """The valid key ``key`` most likely meant: each part spelled as its nearest sibling (``samplr.kap`` →
    ``sampler.cap``), else the same name in another section (``sampler.lr`` → ``learner.lr``), else the nearest."""
    known, parts = schema_keys(schema), key.split(".")
    fixed: list[str] = []
    node: type[BaseModel] | None = schema
    for part in parts:
        fields = list(node.model_fields) if node is not None else []
        near = [part] if part in fields else difflib.get_close_matches(part, fields, n=1, cutoff=0.6)
        if node is None or not near:
            break
        fixed.append(near[0])
        node = _submodel(node.model_fields[near[0]].annotation)
    if len(fixed) == len(parts) and ".".join(fixed) in known:
        return ".".join(fixed)
    moved = [k for k in known if k.rpartition(".")[2] == parts[-1]]
    if moved:
        return moved[0]
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return near[0] if near else None


def unknown_key_line(schema: type[BaseModel], key: str) -> str:
    """``unknown key K; did you mean `V`?`` (without the question when nothing is close)."""
    near = closest_key(schema, key)
    return f"unknown key {key}" + (f"; did you mean `{near}`?" if near else "")


def read_yaml(path: Path, schema: type[BaseModel] | None = None, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of a YAML config file over its ``base:`` file's (relative to it); every problem, and with
    ``schema`` an unknown key, is a :class:`~divopd.errors.ConfigError` naming the file that holds it."""
    shown, path = path, path.resolve()
    if path in seen:
        raise ConfigError(f"config {path}: `base:` cycle through {' -> '.join(str(p) for p in seen)}")
    data = read_yaml_mapping(path, "config", "setting, method, student, teacher, ...", ConfigError, shown)
    base = data.pop("base", None)
    if schema is not None and (unknown := unknown_key(schema, data)) is not None:
        raise ConfigError(f"{shown}: {unknown_key_line(schema, unknown)}")
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{shown}: base: expected a file name relative to this file, got {base!r}")
    return deep_merge(read_yaml(path.parent / base, schema, (*seen, path)), data)


def _override(item: str) -> tuple[list[str], str]:
    """The key's parts and the raw value of one ``--set KEY=VALUE``."""
    if "=" not in item:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. sampler.cap=6), got {item!r}")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set: empty key in {item!r}")
    return parts, raw


def apply_overrides(data: dict[str, Any], overrides: list[str],
                    schema: type[BaseModel] | None = None) -> dict[str, Any]:
    """``data`` with ``a.b=c`` overrides applied (values parsed as YAML); with ``schema``, an unknown key is a
    :class:`~divopd.errors.ConfigError` naming that ``--set``."""
    out = copy.deepcopy(data)
    for item in overrides:
        parts, raw = _override(item)
        key = ".".join(parts)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({describe_yaml_error(exc)})") from None
        if schema is not None:
            nested: Any = value
            for p in reversed(parts):
                nested = {p: nested}
            unknown = unknown_key(schema, nested)
            if unknown is not None:
                unknown = key if key.startswith(unknown + ".") else unknown  # the key as typed
                raise ConfigError(f"--set {item}: {unknown_key_line(schema, unknown)}")
        node = out
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                raise ConfigError(f"--set {key}: {p!r} is not a section")
            node = node[p]
        node[parts[-1]] = value
    return out


def override_for(overrides: list[str], key: str) -> str | None:
    """The ``--set`` item that wrote dotted ``key`` (or a section above or below it), the last one if several."""
    for item in reversed(overrides):
        name = ".".join(p for p in item.split("=", 1)[0].strip().split(".") if p)
        if name and (key == name or key.startswith(name + ".") or name.startswith(key + ".")):
            return item
    return None


def with_method(raw: dict[str, Any], method: Any) -> dict[str, Any]:
    """``raw`` with the switches of method row ``method`` on (unchanged for no row: the validator names them)."""
    row = ROWS.get(method) if isinstance(method, str) else None
    return raw if row is None else deep_merge(raw, row_switches(row, raw))
