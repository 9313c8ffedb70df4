"""What the study's tests share: the study's folders, its analysis scripts loaded as modules, page blocks, plans."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from divopd.suite.plan import load_plan, plan_runs
from divopd.train.packaged import CONFIGS as PACKAGED_CONFIGS

__all__ = ["CONFIGS", "REGIME", "REPO", "RESULTS", "STUDY", "block", "dart_plan", "script", "seeds_by_label"]


#: the repository root, the study folder in it and the folders of the study the tests read
REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "study"
#: study/regime/: the warm-start study plans and analysis scripts
REGIME = STUDY / "regime"
#: study/results/: the result pages and (under regime/) the committed reports
RESULTS = STUDY / "results"
#: the packaged settings (one YAML per setting), the files the study's plans name by ``configs:``
CONFIGS = PACKAGED_CONFIGS


def script(name: str):
    """study/regime/<name>.py, loaded as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REGIME / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def block(text: str, marker: str) -> str:
    """The lines of a page between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    return text.split(f"<!-- {marker} -->\n")[1].split(f"\n<!-- /{marker} -->")[0]


def dart_plan(name: str):
    """(plan, runs) of study/regime/plan-<name>.yaml, a study over configs/coin6-dart's 40-update runs."""
    plan = load_plan(REGIME / f"plan-{name}.yaml")
    assert plan.configs == "coin6-dart" and plan.cache == "cache/coin6-dart" and plan.updates == 40
    return plan, plan_runs(plan)


def seeds_by_label(runs) -> dict[str, set[int]]:
    """label -> the seeds a plan runs it on."""
    seeds: dict[str, set[int]] = {}
    for r in runs:
        seeds.setdefault(r.label, set()).add(r.seed)
    return seeds
