"""The house (issue 13): sub-packages along the data path, imports that run one way, old module paths as aliases,
one method-row registry that every list of methods reads."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from divopd import _moved
from divopd.sampling import METHODS, ROWS, method_names, method_row
from divopd.sampling.methods import register_method

SRC = Path(__file__).resolve().parents[1] / "src" / "divopd"

#: Layers, bottom first: a package may import its own layer and the layers below, never one above.
LAYERS = [
    {"errors", "_moved", "models", "experience"},
    {"sampling", "explore", "learn"},
    {"train"},
    {"analysis"},
    {"suite", "commands", "cli", "__main__", "__init__"},
]


def _layer(part: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if part in names)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "divopd":  # from divopd import gate: the submodule divopd.gate
                names.update(f"divopd.{a.name}" for a in node.names if a.name.islower() and a.name[0] != "_")
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.startswith("divopd.")}


def test_every_module_is_in_a_layer() -> None:
    for path in SRC.rglob("*.py"):
        _layer(path.relative_to(SRC).parts[0].removesuffix(".py"))


def test_imports_run_one_way() -> None:
    bad = []
    for path in SRC.rglob("*.py"):
        own = path.relative_to(SRC).parts[0].removesuffix(".py")
        for name in _imports(path):
            target = name.split(".")[1]
            if _moved._target(name) is not None or f"divopd.{target}" in _moved.MOVED:
                bad.append(f"{path.relative_to(SRC)} imports the old path {name}")
            elif _layer(target) > _layer(own):
                bad.append(f"{path.relative_to(SRC)} ({own}) imports {name} from a layer above")
    assert not bad, "\n".join(bad)


def test_the_sampler_imports_no_runtime_and_no_torch() -> None:
    for path in (SRC / "sampling").rglob("*.py"):
        tree = ast.parse(path.read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in mods if m.split(".")[0] in ("torch", "ray", "vllm")}, path


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_old_module_paths_are_the_moved_modules(old: str) -> None:
    if old.endswith(("webshop", "alfworld")):
        pytest.skip("optional environment")
    assert importlib.import_module(old) is importlib.import_module(_moved.MOVED[old])


def test_prescribed_public_names_import_where_they_were() -> None:
    from divopd import Turn, gate  # noqa: F401
    from divopd.gate import check  # noqa: F401
    from divopd.loss import opd_loss  # noqa: F401
    from divopd.recovery import should_recover  # noqa: F401
    from divopd.sampling import (  # noqa: F401
        SamplerConfig,
        allocate_rollout_first,
        focus_order,
        make_sampler,
        register_method,
    )
    from divopd.train import train  # noqa: F401

    assert gate.check is check


def test_rows_cover_every_sampler_rule_and_keep_the_old_lists() -> None:
    assert set(METHODS) <= set(ROWS)
    assert all(ROWS[name].rule in METHODS for name in method_names())
    assert set(method_names()) >= set(METHODS)
    assert method_names("paper") == ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "divopd-focus",
                                     "top-b", "divopd-r", "tcod-f2b", "turnopd")  # the order of issue 14's list
    assert method_names("coverage") == ("vanilla", "nocap", "divopd-base", "divopd")
    assert method_names("replay") == ("vanilla", "divopd-base", "divopd")
    assert method_names("demo-replay") == ("vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd")
    from divopd.config import METHOD_ROWS, sampler_method_for

    assert METHOD_ROWS == {"divopd-r": "divopd", "tcod-f2b": "vanilla", "turnopd": "vanilla"}
    assert sampler_method_for("divopd-r") == "divopd" and sampler_method_for("nocap") == "nocap"
    with pytest.raises(ValueError, match="unknown method"):
        method_row("no-such-row")


def test_a_registered_method_gets_a_row_after_the_built_in_ones() -> None:
    from divopd.sampling.methods import compose_oldest

    name = "test-layout-rule"
    try:
        register_method(name, compose_oldest, "a test rule")
        assert method_names()[-1] == name and ROWS[name].rule == name and not ROWS[name].tags
        from divopd.report import _method_key

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


def test_no_source_file_over_400_lines_and_no_function_over_90() -> None:
    """The house's size rule (issue 13: files ≤ 400 lines, functions ~80; 90 leaves room for long signatures)."""
    long_files, long_functions = [], []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 400:
            long_files.append(f"{path.relative_to(SRC)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 90:
                long_functions.append(f"{path.relative_to(SRC)}:{node.name}: {node.end_lineno - node.lineno + 1}")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)
