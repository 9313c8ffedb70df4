"""``divopd tasks CONFIG --for {trinity,verl} --split SPLIT --out FILE``: the task file a framework's per-turn OPD
workflow (Trinity-RFT) or agent loop (verl) reads, one row per task of the setting's environment in its own order
(the row keys: docs/integrations/trinity.md). :func:`task_rows` builds framework-neutral rows; :data:`FORMATS` names
each framework's writer (imported only when used)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from divopd.errors import UsageError, one_line

__all__ = ["EXPLORER_KEYS", "FORMATS", "add_arguments", "run", "task_rows", "writer"]

#: framework -> ``"module:function"`` of its ``write_tasks(rows: list[dict], out: Path) -> None`` (imported lazily)
FORMATS: dict[str, str] = {
    "trinity": "divopd.integrations.trinity_tasks:write_tasks",
    "verl": "divopd.integrations.verl_tasks:write_tasks",
}

#: The explorer settings a row carries (``explorer``): how a turn's prompt is built, how the student decodes, +R.
EXPLORER_KEYS = ("prompt", "generation", "recovery", "truncated_turns_dead")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="a packaged setting's name (alfworld, scienceworld, webshop, tiny, ...) or the "
                        "path of a YAML config, as divopd train takes")
    parser.add_argument("--method", help="the method row (divopd-r switches +R on in the rows); default: the config's")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set explorer.max_steps=20 (repeatable)")
    parser.add_argument("--for", dest="framework", required=True, choices=sorted(FORMATS),
                        help="the framework whose task-file format to write")
    parser.add_argument("--split", required=True, help="the environment's task split (train, dev, test)")
    parser.add_argument("--out", required=True, help="the task file to write; its folder is created when missing (an "
                        "existing file is never overwritten)")
    parser.add_argument("--limit", type=int, help="only the first N tasks of the split")


def task_rows(cfg: Any, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """One framework-neutral row per task of ``split`` of ``cfg``'s environment (a :class:`TrainConfig`), in the
    environment's order, at most ``limit``. Raises :class:`UsageError` (one line) when the environment cannot be
    built or lists no task for ``split``."""
    from divopd.explore.envs import EnvCrash, EnvSetupError, make_env

    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be >= 1, got {limit}")
    explorer = cfg.explorer
    try:
        env = make_env(explorer.env, **explorer.env_kwargs)
    except EnvSetupError as exc:
        raise UsageError(f"explorer.env {explorer.env!r} is not set up here: {one_line(exc, 1000)}") from None
    except (ImportError, EnvCrash, OSError, TypeError, ValueError) as exc:
        raise UsageError(f"explorer.env {explorer.env!r}: cannot build the environment to list its tasks: "
                         f"{one_line(exc, 1000)}") from None
    try:
        tasks = list(env.tasks(split))
    except EnvSetupError as exc:
        raise UsageError(f"explorer.env {explorer.env!r} is not set up here: {one_line(exc, 1000)}") from None
    except (EnvCrash, OSError, KeyError, ValueError) as exc:
        raise UsageError(f"--split {split!r}: environment {explorer.env!r} cannot list it: {one_line(exc, 300)}") \
            from None
    finally:
        env.close()
    if not tasks:
        raise UsageError(f"--split {split!r}: environment {explorer.env!r} has no tasks in it")
    settings = explorer.model_dump(mode="json", include=set(EXPLORER_KEYS))
    settings["generation"] = {k: settings["generation"][k] for k in ("max_new_tokens", "temperature", "greedy",
                                                                      "stop_on_newline")}
    return [{"env": explorer.env, "env_kwargs": dict(explorer.env_kwargs), "split": split, "task": str(task),
             "index": i, "max_steps": int(explorer.max_steps), "setting": cfg.setting, "method": cfg.method,
             "explorer": settings}
            for i, task in enumerate(tasks[:limit])]


def writer(framework: str) -> Any:
    """The ``write_tasks`` function of ``framework`` (:data:`FORMATS`); one :class:`UsageError` line when its module
    cannot be imported (the framework's side is not installed)."""
    if framework not in FORMATS:
        raise UsageError(f"--for {framework!r}: unknown framework; known: {', '.join(FORMATS)}")
    module_name, _, name = FORMATS[framework].partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--for {framework}: cannot load its task writer {FORMATS[framework]} "
                         f"({one_line(exc, 200)})") from None


def run(args: argparse.Namespace) -> int:
    from divopd.train.config import load_config

    out = Path(args.out)
    if out.exists():
        raise UsageError(f"--out {out}: exists; divopd never overwrites a file (remove it or choose another path)")
    if out.parent.exists() and not out.parent.is_dir():
        raise UsageError(f"--out {out}: {out.parent} exists and is not a directory")
    write = writer(args.framework)
    method = [f"method={args.method}"] if args.method else []
    cfg = load_config(args.config, [*method, *args.overrides])
    rows = task_rows(cfg, args.split, args.limit)
    missing = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create its directory {out.parent} ({one_line(exc, 200)})") from None
    try:
        write(rows, out)
    except UsageError:
        for d in missing:  # the folders made for it, left empty by a refused file
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
    print(f"{out}: {len(rows)} {args.split} tasks of {cfg.explorer.env} ({cfg.setting}, {cfg.method}) "
          f"for {args.framework}")
    if args.framework == "trinity":
        print(trinity_batch_size_line(cfg))
    return 0


def trinity_batch_size_line(cfg: Any, repeat_times: int = 1) -> str:
    """The suggested Trinity ``buffer.batch_size`` (tasks per explore step) for ``cfg``'s B and horizon: the matched
    dispatch rule (:mod:`divopd.integrations.dispatch`) at the default ``target_arrival_ratio``, from half the
    horizon as the turns per task."""
    from divopd.integrations.dispatch import TARGET_ARRIVAL_RATIO, ArrivalDispatch, start_turns_per_session

    batch, horizon = int(cfg.sampler.batch_size), int(cfg.explorer.max_steps)
    rule = ArrivalDispatch(batch_size=batch, horizon=horizon, sessions_per_prompt=repeat_times)
    return (f"suggested Trinity buffer.batch_size: {rule.suggested_prompts_per_step()} (tasks per explore step = "
            f"target_arrival_ratio {TARGET_ARRIVAL_RATIO:g} x B {batch} / {start_turns_per_session(horizon):g} turns "
            f"per task, half the horizon {horizon}; divide by algorithm.repeat_times; the strategy warns at the first "
            "steps when the measured ratio is off)")
