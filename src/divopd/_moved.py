"""Old module paths of divopd, kept importable after the move to sub-packages along the data path.

``import divopd.gate`` (or ``from divopd.loss import opd_loss``) still works: the old name is an alias of the new
module — the same module object, not a copy — so code written against the flat layout keeps running and
``divopd.gate is divopd.sampling.gate``. The table below is the whole list; new code imports the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old module path -> new module path
MOVED: dict[str, str] = {
    "divopd.gate": "divopd.sampling.gate",
    "divopd.experience_log": "divopd.experience.log",
    "divopd.explorer": "divopd.explore.explorer",
    "divopd.generation": "divopd.explore.generation",
    "divopd.prompting": "divopd.explore.prompting",
    "divopd.recovery": "divopd.explore.recovery",
    "divopd.tcod": "divopd.explore.tcod",
    "divopd.envs": "divopd.explore.envs",
    "divopd.loss": "divopd.learn.loss",
    "divopd.learner": "divopd.learn.learner",
    "divopd.checkpoint": "divopd.learn.checkpoint",
    "divopd.diagnostics": "divopd.learn.diagnostics",
    "divopd.sft": "divopd.learn.sft",
    "divopd.trainer": "divopd.train.trainer",
    "divopd.config": "divopd.train.config",
    "divopd.interrupt": "divopd.train.interrupt",
    "divopd.runtime": "divopd.train.runtime",
    "divopd.replay": "divopd.analysis.replay",
    "divopd.simulate": "divopd.analysis.simulate",
    "divopd.tune_cap": "divopd.analysis.tune_cap",
    "divopd.metrics": "divopd.experience.metrics",
    "divopd.analysis.metrics": "divopd.experience.metrics",
    "divopd.report": "divopd.analysis.report",
    "divopd.evaluate": "divopd.train.evaluate",
    "divopd.sft_cli": "divopd.commands.sft",
    "divopd.bench": "divopd.suite.bench",
    "divopd.bench_coverage": "divopd.suite.coverage",
    "divopd.demo": "divopd.suite.demo",
    "divopd.demo_replay": "divopd.suite.demo_replay",
}


def _target(name: str) -> str | None:
    """The new path of ``name`` (also for sub-modules of a moved package, e.g. ``divopd.envs.twx``)."""
    if name in MOVED:
        return MOVED[name]
    for old, new in MOVED.items():
        if name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The target module is imported already."""

    def get_code(self, fullname: str) -> object:
        """The target's code, so that ``python -m divopd.demo`` (an old path) still runs."""
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target)  # type: ignore[union-attr]

    def is_package(self, fullname: str) -> bool:
        spec = importlib.util.find_spec(self.target)
        return bool(spec and spec.submodule_search_locations is not None)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = _target(name)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(name, _AliasLoader(new))


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
