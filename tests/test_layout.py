"""The house rules: sub-packages along the data path, imports that run one way with no circle (lazy
imports included), no compatibility layer, one method-row registry that every list of methods reads.

What counts as an import of module A (``src/divopd/...``): every ``import`` / ``from ... import`` statement anywhere in
A — at module level, inside a function (a lazy import), under ``if TYPE_CHECKING:`` or ``try:`` — relative imports
resolved, plus every ``importlib.import_module("divopd....")`` call with a literal name. ``TYPE_CHECKING``-only imports
count: they do not run, but a type that needs a module above (or a module that needs you back) is the same coupling.
Names: ``divopd.x`` is the package's ``__init__``; ``from divopd.x import y`` is ``divopd.x.y`` when ``y`` is a
submodule, else ``divopd.x``. Importing ``divopd.x.y`` also runs the ``__init__`` of its parents; those implicit edges
are not counted (every module would otherwise sit in one circle through ``divopd/__init__``).
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

from divopd.sampling import METHODS, ROWS, method_names, method_row, register_method

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "divopd"

#: Layers, bottom first: a package may import its own layer and the layers below, never one above.
LAYERS = [
    {"errors", "models", "experience"},
    {"sampling", "explore", "learn"},
    {"train", "integrations"},
    {"analysis"},
    {"suite", "commands", "cli", "__main__", "__init__"},
]

#: The only modules outside ``train/runtime/`` that may import a runtime: the one place that assembles a run.
ASSEMBLY = {"divopd.train.assemble"}

#: What the framework adapters (``integrations/``) may import of divopd: the composer, its records and its errors, and
#: (for the per-turn workflows and agent loops that play divopd's environments with its prompts) ``divopd.explore``.
#: Never the learner, the trainer or a runtime: the framework trains.
INTEGRATIONS_MAY_IMPORT = ("divopd.sampling", "divopd.experience", "divopd.errors", "divopd.integrations",
                           "divopd.explore")

#: The public API: these names stay exported (``__all__``) from these modules.
PUBLIC_API = {
    "divopd": ["Rollout", "Turn", "VLLMGenerator", "gate", "__version__"],
    "divopd.sampling": ["METHODS", "ROWS", "Batch", "Candidate", "Columns", "Ledger", "Method", "MethodRow", "Rule",
                        "Sampler", "SamplerConfig", "allocate_rollout_first", "batch_stats", "effective_rollouts",
                        "focus_order", "get_method", "is_stale", "make_sampler", "method_names", "method_row",
                        "register_method", "uniform_order", "visiting_order"],
    "divopd.sampling.gate": ["REASONS", "check"],
    "divopd.learn.loss": ["REDUCTIONS", "clipped_surrogate", "effective_mask", "opd_loss", "reduce_tokens",
                          "stopped_advantage", "topk_reverse_kl", "topk_reverse_kl_loss"],
    "divopd.explore.recovery": ["RecoveryConfig", "RecoveryState", "is_no_progress", "normalize_action",
                                "should_recover"],
    "divopd.train": ["train"],  # ``from divopd.train import train`` runs (or resumes) one training run
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: every module of the package: name -> file
MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` imports ``target`` at ``line`` (``kind``: ``top``, ``lazy``, ``type-only``,
    ``importlib``)."""

    source: str
    target: str
    line: int
    kind: str

    def where(self) -> str:
        path = MODULES.get(self.source)
        return f"{path.relative_to(REPO) if path else self.source}:{self.line}"


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _module_level_lines(tree: ast.Module) -> set[int]:
    """Lines of imports that run when the module is imported (module level, also inside a top-level ``try``/``if``)."""
    lines: set[int] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines.add(node.lineno)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
    return lines


def _resolve(source: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (relative imports resolved against ``source``'s package)."""
    if node.level == 0:
        return node.module or ""
    package = source.split(".") if MODULES[source].name == "__init__.py" else source.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _literal_call(node: ast.AST, functions: tuple[str, ...]) -> bool:
    """``node`` calls one of ``functions`` (by name or attribute) with a string literal first."""
    return (isinstance(node, ast.Call) and bool(node.args) and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str) and ast.unparse(node.func).split(".")[-1] in functions)


def imports_of(source: str, path: Path) -> list[Edge]:
    """Every import of a ``divopd`` module in ``path`` (see the module docstring for what counts)."""
    tree = ast.parse(path.read_text())
    type_only, top = _type_checking_lines(tree), _module_level_lines(tree)
    edges: list[Edge] = []

    def add(target: str, line: int, kind: str | None = None) -> None:
        if target == "divopd" or target.startswith("divopd."):
            edges.append(Edge(source, target, line,
                              kind or ("type-only" if line in type_only else "top" if line in top else "lazy")))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(source, node)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                add(sub if sub in MODULES else module, node.lineno)
        elif _literal_call(node, ("import_module",)):
            add(node.args[0].value, node.lineno, "importlib")
    return edges


EDGES: list[Edge] = [e for name, path in MODULES.items() for e in imports_of(name, path)]


def _package(module: str) -> str:
    """The top-level part of ``divopd`` a module belongs to (``divopd`` itself is ``__init__``)."""
    return module.split(".")[1] if "." in module else "__init__"


def _layer(part: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if part in names)


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """The shortest import circle through each module that sits on one, each circle once (rotated to start at its
    smallest module)."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in sorted(edges, key=lambda e: (e.kind != "top", e.line)):  # prefer a module-level edge as the witness
        if e.source != e.target:
            graph.setdefault(e.source, {}).setdefault(e.target, e)
    cycles: dict[tuple[str, ...], list[Edge]] = {}
    for start in sorted(graph):
        back: dict[str, Edge] = {}
        queue = deque([start])
        while queue and start not in back:
            node = queue.popleft()
            for target, edge in sorted(graph.get(node, {}).items()):
                if target not in back:
                    back[target] = edge
                    queue.append(target)
        if start not in back:
            continue
        chain = [back[start]]
        while chain[-1].source != start:
            chain.append(back[chain[-1].source])
        chain.reverse()
        first = min(range(len(chain)), key=lambda i: chain[i].source)
        chain = chain[first:] + chain[:first]
        cycles.setdefault(tuple(e.source for e in chain), chain)
    return [cycles[key] for key in sorted(cycles)]


def describe(cycle: list[Edge]) -> str:
    chain = " → ".join([e.source for e in cycle] + [cycle[0].source])
    steps = "; ".join(f"{e.where()} imports {e.target} ({e.kind})" for e in cycle)
    return f"{chain}\n    {steps}"


def test_every_module_is_in_a_layer() -> None:
    for name in MODULES:
        assert any(_package(name) in names for names in LAYERS), f"{name}: its package is in no layer of LAYERS"


def test_every_divopd_import_names_a_real_module() -> None:
    """No import through a path that is not a module (the old flat paths ``divopd.gate``, ``divopd.loss``, ... are
    gone): a lazy import of a missing module would fail only when its function runs."""
    bad = [f"{e.where()} imports {e.target}: no such module under src/divopd" for e in EDGES if e.target not in MODULES]
    assert not bad, "\n".join(bad)


def against_layers(edges: list[Edge]) -> list[Edge]:
    """Imports of a module in a layer above the importer's."""
    return [e for e in edges if _layer(_package(e.target)) > _layer(_package(e.source))]


def learn_into_train(edges: list[Edge]) -> list[Edge]:
    """Imports of ``divopd.train`` from ``learn/``."""
    return [e for e in edges if _package(e.source) == "learn" and _package(e.target) == "train"]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def runtime_importers(edges: list[Edge]) -> list[Edge]:
    """Imports of ``divopd.train.runtime...`` from outside it, other than by the :data:`ASSEMBLY` modules."""
    return [e for e in edges if _in(e.target, "divopd.train.runtime") and not _in(e.source, "divopd.train.runtime")
            and e.source not in ASSEMBLY]


def integrations_outside(edges: list[Edge]) -> list[Edge]:
    """Imports from ``integrations/`` of a divopd module other than those in :data:`INTEGRATIONS_MAY_IMPORT`."""
    return [e for e in edges if _package(e.source) == "integrations"
            and not any(_in(e.target, m) for m in INTEGRATIONS_MAY_IMPORT)]


def test_each_rule_flags_a_bad_import_and_passes_a_good_one() -> None:
    """The rules below on made-up imports (the real graph may have none that breaks a rule)."""
    def edge(source: str, target: str) -> Edge:
        return Edge(source, target, 1, "lazy")

    up, down = edge("divopd.sampling.x", "divopd.train.loop"), edge("divopd.train.loop", "divopd.sampling.x")
    assert against_layers([up, down]) == [up]
    bad, ok = edge("divopd.learn.learner", "divopd.train.config"), edge("divopd.learn.learner", "divopd.learn.loss")
    assert learn_into_train([bad, ok]) == [bad]
    bad = edge("divopd.train.trainer", "divopd.train.runtime.ray")
    ok = edge("divopd.train.assemble", "divopd.train.runtime")
    inside = edge("divopd.train.runtime.threads", "divopd.train.runtime.common")
    assert runtime_importers([bad, ok, inside]) == [bad]
    bad = edge("divopd.integrations.trl", "divopd.learn.loss")
    ok = [edge("divopd.integrations.trl", m) for m in ("divopd.sampling.sampler", "divopd.experience.turn",
                                                        "divopd.errors", "divopd.integrations.common")]
    assert integrations_outside([bad, *ok]) == [bad]


def test_imports_run_one_way() -> None:
    bad = [f"{e.where()} ({_package(e.source)}, layer {_layer(_package(e.source))}) imports {e.target} "
           f"({_package(e.target)}, layer {_layer(_package(e.target))}), a layer above ({e.kind} import): move the "
           "shared code down, or let the upper layer pass it in"
           for e in against_layers([e for e in EDGES if e.target in MODULES])]
    assert not bad, "\n".join(bad)


def test_no_import_circles_lazy_imports_included() -> None:
    cycles = find_cycles([e for e in EDGES if e.target in MODULES])
    assert not cycles, (f"{len(cycles)} import circle(s) (a lazy or TYPE_CHECKING import closes a circle too; break "
                        "it by moving the shared code into a module both can import, or by passing the object in):\n"
                        + "\n".join(describe(c) for c in cycles))


def test_find_cycles_names_each_circle_once_as_a_chain() -> None:
    """The cycle finder itself: a 3-circle and a 2-circle sharing a module, and an acyclic tail."""
    edges = [Edge("divopd.a", "divopd.b", 1, "top"), Edge("divopd.b", "divopd.c", 2, "lazy"),
             Edge("divopd.c", "divopd.a", 3, "top"), Edge("divopd.c", "divopd.d", 4, "top"),
             Edge("divopd.d", "divopd.c", 5, "type-only"), Edge("divopd.d", "divopd.errors", 6, "top")]
    chains = [[e.source for e in c] for c in find_cycles(edges)]
    assert chains == [["divopd.a", "divopd.b", "divopd.c"], ["divopd.c", "divopd.d"]]
    assert not find_cycles(edges[:2] + edges[3:4] + edges[5:])


def test_imports_of_sees_lazy_relative_type_only_and_importlib_imports(tmp_path: Path) -> None:
    source = "divopd.learn.learner"
    path = tmp_path / "learner.py"
    path.write_text("from typing import TYPE_CHECKING\nimport importlib\nfrom . import loss\n"
                    "if TYPE_CHECKING:\n    from divopd.sampling.sampler import Batch\n"
                    "def f():\n    from ..train import trainer\n"
                    "    return importlib.import_module('divopd.models.tiny')\n")
    got = {(e.target, e.line, e.kind) for e in imports_of(source, path)}
    assert got == {("divopd.learn.loss", 3, "top"), ("divopd.sampling.sampler", 5, "type-only"),
                   ("divopd.train.trainer", 7, "lazy"), ("divopd.models.tiny", 8, "importlib")}


def _third_party(package: str) -> set[tuple[str, str]]:
    """``(file, top-level module)`` of every import in ``src/divopd/<package>``, lazy ones included."""
    found = set()
    for path in (SRC / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {(str(path.relative_to(REPO)), a.name.split(".")[0]) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((str(path.relative_to(REPO)), node.module.split(".")[0]))
    return found


def test_the_sampler_imports_no_runtime_and_no_torch() -> None:
    bad = sorted(f"{f} imports {m}" for f, m in _third_party("sampling") if m in ("torch", "ray", "vllm"))
    assert not bad, "the sampler is pure Python + numpy, usable inside any trainer:\n" + "\n".join(bad)


def test_learn_imports_neither_train_nor_ray() -> None:
    bad = sorted(f"{f} imports {m}" for f, m in _third_party("learn") if m == "ray")
    bad += [f"{e.where()} imports {e.target}" for e in learn_into_train(EDGES)]
    assert not bad, ("learn/ is the update on one process or rank; Ray actors and the run around it belong to "
                     "train/runtime/:\n" + "\n".join(bad))


def test_only_the_assembly_imports_a_runtime() -> None:
    bad = [f"{e.where()} imports {e.target}" for e in runtime_importers(EDGES)]
    assert not bad, (f"only {sorted(ASSEMBLY)} picks and builds a runtime; pass what you need from the runtime in "
                     "instead:\n" + "\n".join(bad))


def test_integrations_import_only_the_sampler_its_records_and_explore() -> None:
    bad = [f"{e.where()} imports {e.target}" for e in integrations_outside(EDGES)]
    assert not bad, f"integrations/ may import only {INTEGRATIONS_MAY_IMPORT} of divopd:\n" + "\n".join(bad)


def _code_files() -> list[Path]:
    dirs = [REPO / d for d in ("tests", "benchmarks", "scripts", "docs", "study")]
    return sorted(p for d in dirs if d.is_dir() for p in d.rglob("*.py"))


def _doc_files() -> list[Path]:
    dirs = [REPO / d for d in ("docs", "study", "benchmarks")]
    pages = sorted(p for d in dirs if d.is_dir() for p in d.rglob("*.md"))
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *pages]


def _bound_names(module: str) -> set[str]:
    """Names a module binds at import time (definitions, assignments, imports, ``__all__``), read from its source."""
    tree = ast.parse(MODULES[module].read_text())
    names: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        elif isinstance(node, (ast.If, ast.Try)):
            todo += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
    return names


def _real(name: str, kind: str) -> bool:
    """``kind`` ``module``: ``name`` is a module of divopd; ``from`` (``from M import a`` as ``M.a``): ``M`` is a
    module and binds ``a`` or has the submodule ``a``; ``attr`` (a ``monkeypatch.setattr`` target): a name that the
    longest module prefix binds."""
    if kind == "module" or name in MODULES:
        return name in MODULES
    module, _, attr = name.rpartition(".")
    if kind == "from":
        return module in MODULES and attr in _bound_names(module)
    parts = name.split(".")
    prefix = next(i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in MODULES or i == 1)
    return ".".join(parts[:prefix]) in MODULES and parts[prefix] in _bound_names(".".join(parts[:prefix]))


def _named_in_code(path: Path) -> list[tuple[int, str, str]]:
    """``(line, dotted name, kind)`` of every divopd import, ``import_module("divopd...")`` and
    ``monkeypatch.setattr("divopd...", ...)`` in a Python file (``kind``: see :func:`_real`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, "module") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}", "from") for a in node.names if a.name != "*"]
        elif _literal_call(node, ("import_module",)):
            found.append((node.lineno, node.args[0].value, "module"))
        elif _literal_call(node, ("setattr",)):
            found.append((node.lineno, node.args[0].value, "attr"))
    return [(line, name, kind) for line, name, kind in found if name.split(".")[0] == "divopd"]


#: ``import divopd.x.y`` / ``from divopd.x.y import a, b`` in a Markdown page
_MD_IMPORT = re.compile(r"^\s*(?:from\s+(divopd[\w.]*)\s+import\s+\(?([\w, ]+)|import\s+(divopd[\w.]*))", re.M)


def test_real_paths_reject_the_old_ones() -> None:
    assert _real("divopd.sampling.gate", "module") and _real("divopd.sampling.gate.check", "from")
    assert _real("divopd.sampling.gate", "from") and _real("divopd.gate", "from")  # divopd/__init__ binds gate
    assert _real("divopd.train.train", "attr") and _real("divopd.commands.bench.train_runs", "attr")
    assert not _real("divopd.gate", "module") and not _real("divopd.gate.check", "from")
    assert not _real("divopd.bench", "from") and not _real("divopd.commands.train_runs", "attr")
    assert not _real("divopd.envs.tiny.TinyEnv", "attr")


def test_tests_benchmarks_and_docs_import_real_paths() -> None:
    """Tests, benchmarks, scripts and the docs' code import the modules where they live (no old flat paths such as
    ``divopd.gate``, ``from divopd import bench``): a lazy import of a path that is gone fails only when it runs."""
    bad = [f"{path.relative_to(REPO)}:{line} {'imports' if kind != 'attr' else 'patches'} {name}"
           for path in _code_files() for line, name, kind in _named_in_code(path) if not _real(name, kind)]
    for path in _doc_files():
        for match in _MD_IMPORT.finditer(path.read_text()):
            names = ([(f"{match.group(1)}.{n.strip()}", "from") for n in match.group(2).split(",") if n.strip()]
                     if match.group(1) else [(match.group(3), "module")])
            bad += [f"{path.relative_to(REPO)}: {match.group(0).strip()} ({n})" for n, k in names if not _real(n, k)]
    assert not bad, "old or unknown module paths (import the module where it lives now):\n" + "\n".join(bad)


@pytest.mark.parametrize("module", sorted(PUBLIC_API))
def test_the_public_api_keeps_its_names(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in PUBLIC_API[module] if n not in mod.__all__ or (n != "VLLMGenerator" and not hasattr(mod, n))]
    assert not missing, f"{module} no longer exports {missing} (public API)"


def test_rows_cover_every_sampler_rule_and_keep_the_old_lists() -> None:
    assert set(METHODS) <= set(ROWS)
    assert all(ROWS[name].rule in METHODS for name in method_names())
    assert set(method_names()) >= set(METHODS)
    assert method_names("paper") == ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "divopd-focus",
                                     "top-b", "divopd-r", "tcod-f2b", "turnopd")  # the paper's table order
    assert method_names("coverage") == ("vanilla", "nocap", "divopd-base", "divopd")
    assert method_names("replay") == ("vanilla", "divopd-base", "divopd")
    assert method_names("demo-replay") == ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd")
    from divopd.train.config import METHOD_ROWS, sampler_method_for

    assert METHOD_ROWS == {"divopd-r": "divopd", "tcod-f2b": "vanilla", "turnopd": "vanilla"}
    assert sampler_method_for("divopd-r") == "divopd" and sampler_method_for("nocap") == "nocap"
    with pytest.raises(ValueError, match="unknown method"):
        method_row("no-such-row")


def test_a_registered_method_gets_a_row_after_the_built_in_ones() -> None:
    from divopd.sampling.rules import select_oldest

    name = "test-layout-rule"
    try:
        register_method(name, select_oldest, "a test rule")
        assert method_names()[-1] == name and ROWS[name].rule == name and not ROWS[name].tags
        from divopd.analysis.report import _method_key

        assert _method_key(name, "vanilla")[0] == 1  # the report orders it by the registry
    finally:
        METHODS.pop(name, None)
        ROWS.pop(name, None)


def test_each_row_is_one_record_with_its_rule_features_and_check() -> None:
    """The record declares the sampler rule, the features a row switches on and the check they need; the config
    applies and checks them (divopd.train.config reads nothing else about a row)."""
    from divopd.sampling.registry import check_row, row_switches
    from divopd.train.config import load_config

    assert ROWS["divopd-r"].sampler is ROWS["divopd"].sampler and ROWS["turnopd"].sampler is ROWS["vanilla"].sampler
    switched = {name: {(s.key, s.side) for s in ROWS[name].switches} for name in method_names() if ROWS[name].switches}
    assert switched == {"divopd-r": {("explorer.recovery.enabled", "explorer")},
                        "tcod-f2b": {("tcod.enabled", "explorer")},
                        "turnopd": {("turnopd.enabled", "explorer"), ("learner.depth_stats", "learner"),
                                    ("learner.turn_balance_updates", "learner")}}
    assert row_switches(ROWS["turnopd"], {"updates": 7}) == {
        "turnopd": {"enabled": True}, "learner": {"depth_stats": True, "turn_balance_updates": 7}}
    assert row_switches(ROWS["turnopd"], {"updates": 7, "learner": {"turn_balance_updates": 40}}) == {
        "turnopd": {"enabled": True}, "learner": {"depth_stats": True}}  # a saved config keeps its schedule
    assert check_row(ROWS["tcod-f2b"], {"tcod.enabled": False}.get) == "method tcod-f2b needs tcod.enabled: true"
    assert check_row(ROWS["tcod-f2b"], {"tcod.enabled": True}.get) is None
    for name in method_names():  # every row on one setting file: its switches on, and nothing else switched
        row = ROWS[name]
        cfg = load_config("tiny", [f"method={name}"])
        assert cfg.sampler_config().method == row.rule
        on = {key for key in ("explorer.recovery.enabled", "tcod.enabled", "turnopd.enabled") if cfg.get(key)}
        assert on == {s.key for s in row.switches if s.key.endswith(".enabled")}, name


def test_a_row_with_its_own_check_is_checked_by_the_config() -> None:
    from divopd.sampling.registry import MethodRow, Switch, add_row
    from divopd.train.config import load_config

    name = "test-layout-row"
    row = MethodRow(name, METHODS["divopd"], "divopd, recovery on, k <= 3", switches=(
        Switch("explorer.recovery.enabled", "explorer"),), check=lambda get: None if get("sampler.cap") <= 3 else
        "method test-layout-row needs sampler.cap <= 3")
    try:
        add_row(row)
        cfg = load_config("tiny", [f"method={name}", "sampler.cap=3"])
        assert cfg.explorer.recovery.enabled and cfg.sampler_config().method == "divopd"
        with pytest.raises(ValueError, match="needs sampler.cap <= 3"):
            load_config("tiny", [f"method={name}"])
        with pytest.raises(ValueError, match="already registered"):
            add_row(row)
    finally:
        ROWS.pop(name, None)


def test_the_sampling_modules_import_each_other_one_way() -> None:
    """No import circle inside divopd.sampling, counting every import (lazy and TYPE_CHECKING ones too)."""
    graph: dict[str, set[str]] = {}
    for path in (SRC / "sampling").glob("*.py"):
        if path.stem == "__init__":
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names |= {m.split(".")[2] for m in modules if m.startswith("divopd.sampling.")}
            assert not (isinstance(node, ast.ImportFrom) and node.module == "divopd.sampling"), path
        graph[path.stem] = names - {path.stem}
    done: set[str] = set()
    while len(done) < len(graph):  # peel the modules whose imports are all peeled; a circle leaves some behind
        ready = {m for m, deps in graph.items() if m not in done and deps <= done}
        assert ready, f"import circle among {sorted(set(graph) - done)}"
        done |= ready


def test_no_source_file_over_500_lines_and_no_function_over_90() -> None:
    """The house's size rule: one concern per file, split by concern past ~500 lines (never by packing lines);
    functions ~80 lines (90 leaves room for long signatures)."""
    long_files, long_functions = [], []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 500:
            long_files.append(f"{path.relative_to(SRC)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 90:
                long_functions.append(f"{path.relative_to(SRC)}:{node.name}: {node.end_lineno - node.lineno + 1}")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)
