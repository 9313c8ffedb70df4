"""Running the paper benchmark's runs: each run's state (:func:`run_state`: finished runs are skipped, partial ones
resumed), its training config (:func:`run_config`), the dry-run listing and :func:`train_runs`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Literal

import yaml

from divopd.suite.plan import Plan, PlannedRun


def run_state(run_dir: Path) -> Literal["done", "partial", "todo"]:
    """``done`` (summary.json: the bench skips it, ``divopd train --resume`` says it is finished), ``partial``
    (config.yaml and no summary, or one with fewer updates than the config asks for, as after ``max_seconds``:
    resumed) or ``todo`` (not started)."""
    if (run_dir / "summary.json").is_file():
        try:
            done = json.loads((run_dir / "summary.json").read_text()).get("updates")
            wanted = yaml.safe_load((run_dir / "config.yaml").read_text()).get("updates")
        except (OSError, ValueError, AttributeError, yaml.YAMLError):
            return "done"
        if isinstance(done, int) and isinstance(wanted, int) and done < wanted:
            return "partial"
        return "done"
    if (run_dir / "config.yaml").is_file():
        return "partial"
    return "todo"


def run_config(r: PlannedRun, plan: Plan, out: Path, models: dict[str, Path]):  # -> TrainConfig
    """The training config of one planned run: the plan's setting file with the run's method row + the setting's models
    + the run's overrides."""
    from divopd.train.config import load_config

    r = r.main or r  # a sweep point shared with a main run has that run's config
    fixed = [f"seed={r.seed}", f"updates={plan.updates}", f"setting={json.dumps(r.config_setting)}",
             f"run_dir={json.dumps(str(r.run_dir(out)))}", f"student.path={json.dumps(str(models['student']))}",
             f"teacher.path={json.dumps(str(models['teacher']))}"]
    return load_config(plan.config_file, [f"method={r.method}", *r.overrides, *fixed])


def distinct_run_dirs(runs: list[PlannedRun], out: Path) -> list[Path]:
    """The run directories of ``runs`` in plan order, each once: a sweep point shared with a main run is that run."""
    return list(dict.fromkeys(r.run_dir(out) for r in runs))


def dry_run_text(runs: list[PlannedRun], out: Path) -> str:
    """The plan as text: one line per run with its state, then counts."""
    lines = []
    for r in runs:
        state = run_state(r.run_dir(out))
        extra = " ".join(r.overrides)
        shared = f"  (= main run {r.main.key})" if r.main is not None else ""
        lines.append(f"{state:7s} {r.run_dir(out)}  [{r.method}{' ' + extra if extra else ''}]{shared}")
    dirs = distinct_run_dirs(runs, out)
    counts = {s: sum(run_state(d) == s for d in dirs) for s in ("done", "partial", "todo")}
    lines.append(f"{len(dirs)} runs: {counts['done']} done, {counts['partial']} to resume, {counts['todo']} to start")
    return "\n".join(lines)


def train_runs(runs: list[PlannedRun], plan: Plan, out: Path, models: dict[str, Path]) -> None:
    """Train every selected run that is not finished (resume the partial ones)."""
    from divopd.train import train

    for i, r in enumerate(runs, 1):
        r = r.main or r  # a sweep point shared with a main run is trained as that run
        run_dir = r.run_dir(out)
        state = run_state(run_dir)
        if state == "done":
            print(f"bench: [{i}/{len(runs)}] {r.key} finished, kept", flush=True)
            continue
        t0 = time.perf_counter()
        print(f"bench: [{i}/{len(runs)}] {'resuming' if state == 'partial' else 'training'} {r.key}", flush=True)
        if state == "partial":
            summary = train(None, resume=run_dir, progress=sys.stderr.isatty())
        else:
            summary = train(run_config(r, plan, out, models), progress=sys.stderr.isatty())
        print(f"bench: {r.key}: peak SR {summary.get('peak_sr')}, arrival/drain "
              f"{summary.get('arrival_drain_ratio')}, {time.perf_counter() - t0:.0f}s", flush=True)

