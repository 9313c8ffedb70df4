"""Input errors of the ``divopd`` commands (:class:`UsageError` and its subclasses, each one line; the policy is in
:mod:`divopd.cli`) and the light checks that raise them before torch or transformers are loaded."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "InputFileError", "RunExistsError", "UsageError", "check_model_folder",
           "check_tokenizer_folder", "describe_validation_error", "describe_yaml_error", "env_flag", "hf_offline",
           "one_line", "read_yaml_mapping"]


class UsageError(Exception):
    """Input the command cannot use. The message is the whole story, on one line (the file, the key, the form)."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class ConfigError(UsageError, ValueError):
    """A training config that cannot be used (file, YAML, ``--set`` or validation); names the file and the key."""


class InputFileError(UsageError, FileNotFoundError):
    """An input file or folder that does not exist or is not what the command needs."""


class RunExistsError(UsageError, FileExistsError):
    """A fresh run was asked for in a run directory that already holds one (``--resume`` it, or choose another)."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, stripped, or its type's name when it has none."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def one_line(text: Any, limit: int = 600) -> str:
    """``text`` with every run of whitespace holding a newline collapsed to one space, cut at ``limit`` characters."""
    s = re.sub(r"\s*\n\s*", " ", str(text)).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


def describe_validation_error(exc: Any, max_errors: int = 4) -> str:
    """A pydantic ``ValidationError`` as one line: ``key.path: message (got value)`` per error, joined by ``; ``."""
    parts = []
    errors = exc.errors(include_url=False)
    for err in errors[:max_errors]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        kind, msg = err.get("type", ""), str(err.get("msg", "")).removeprefix("Value error, ")
        if kind == "extra_forbidden":
            msg = "Extra inputs are not permitted (unknown key)"
        elif kind == "missing":
            msg = "required key is missing"
        elif kind != "value_error" and "input" in err and not isinstance(err["input"], (dict, list)):
            got = repr(err["input"])
            got = got if len(got) <= 60 else got[:56] + "...'"
            msg = f"{msg} (got {got})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > max_errors:
        parts.append(f"and {len(errors) - max_errors} more error(s)")
    return one_line("; ".join(parts))


def describe_yaml_error(exc: Any) -> str:
    """A ``yaml.YAMLError`` as one line: ``line L, column C: problem`` (the position of the problem, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return one_line(f"{where}{problem}")


def read_yaml_mapping(path: Path, kind: str, holds: str, error: type[UsageError], shown: object = None
                      ) -> dict[str, Any]:
    """The top-level mapping of the YAML ``kind`` file (``config``, ``plan``) at ``path``; a file that is missing, a
    directory, unreadable, not text, not YAML, empty or not a mapping is one ``error`` line naming ``shown`` (default
    ``path``) and, for the last two, what the mapping ``holds``."""
    import yaml

    shown = path if shown is None else shown
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{shown}: no such {kind} file") from None
    except IsADirectoryError:
        raise error(f"{shown}: not a {kind} file (a directory)") from None
    except OSError as exc:
        raise error(f"{shown}: cannot read the {kind} file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{shown}: not a YAML text file ({exc.reason})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{shown}: YAML syntax error at {describe_yaml_error(exc)}") from None
    if data is None:
        raise error(f"{shown}: empty {kind} file; expected a mapping ({holds})")
    if not isinstance(data, dict):
        raise error(f"{shown}: the top level must be a mapping ({holds}), got {type(data).__name__}")
    return data


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to 1, true, yes or on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hf_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` asks for no network."""
    return env_flag("HF_HUB_OFFLINE") or env_flag("TRANSFORMERS_OFFLINE")


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _looks_like_local_path(path: str) -> bool:
    """A string no Hugging Face repo id could be: absolute, ``./``/``~``-relative, several ``/``, odd characters."""
    return (path.startswith(("/", ".", "~")) or "\\" in path or path.endswith("/") or path.count("/") > 1
            or not _REPO_ID.match(path))


def _in_hf_cache(repo_id: str, filename: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, filename), str)
    except Exception:  # an invalid repo id, an unreadable cache: not in the cache
        return False


def check_model_folder(path: str | os.PathLike, key: str, *, marker: str = "config.json",
                       what: str = "a model folder") -> None:
    """Raise :class:`UsageError` naming ``key`` unless ``path`` can be loaded as a model (a local folder holding
    ``marker``, or a hub name; offline, one in the local HF cache), without loading anything."""
    text = str(path)
    if not text.strip():
        raise UsageError(f"{key}: empty path; expected {what}")
    p = Path(text).expanduser()
    if p.is_dir():
        if not (p / marker).is_file():
            if marker == "config.json" and (p / "adapter_config.json").is_file():
                raise UsageError(f"{key}: {text} is a PEFT adapter without its base model (adapter_config.json, no "
                                 f"config.json); point {key} at the base model folder, or merge it first: divopd "
                                 f"export {text} --merged --out DIR")
            raise UsageError(f"{key}: {text} is not {what} (no {marker})")
        return
    if p.exists():
        raise UsageError(f"{key}: {text} is not {what} (a file, not a folder)")
    if _looks_like_local_path(text):
        raise UsageError(f"{key}: {text} is not {what} (no such folder)")
    if hf_offline() and not _in_hf_cache(text, marker):
        raise UsageError(f"{key}: {text} is not {what} (no such folder) and, offline (HF_HUB_OFFLINE), "
                         f"not a Hugging Face model in the local cache; {hub_download_hint(text)}")


def hub_download_hint(repo_id: str) -> str:
    """How to get a Hugging Face hub model into the local cache that an offline run reads."""
    return f"download it once with the network on: `hf download {repo_id}`"


def is_hub_name(path: str | os.PathLike) -> bool:
    """Whether ``path`` is read as a Hugging Face hub name (no such local path, and a form a repo id can take)."""
    text = str(path)
    return bool(text.strip()) and not Path(text).expanduser().exists() and not _looks_like_local_path(text)


def check_tokenizer_folder(path: str | os.PathLike, key: str) -> None:
    """Like :func:`check_model_folder` for a tokenizer: a local folder must hold ``tokenizer_config.json``."""
    check_model_folder(path, key, marker="tokenizer_config.json", what="a tokenizer folder")
