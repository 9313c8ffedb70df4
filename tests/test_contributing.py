"""CONTRIBUTING.md's layout tree matches the code: every module and folder it names exists, and it names every module
of the packages it details (train/, train/runtime/, learn/, explore/, experience/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DETAILED = ("train", "train/runtime", "learn", "explore", "experience")


def tree_paths() -> set[str]:
    """The paths (relative to ``src/divopd``) the tree in CONTRIBUTING.md's "Layout" section names."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    block = re.search(r"## Layout\n.*?```\n(.*?)```", text, re.S)
    assert block, "CONTRIBUTING.md: no tree in the Layout section"
    lines = block.group(1).splitlines()
    assert lines[0].strip() == "src/divopd/"
    stack: list[tuple[int, str]] = []  # (indent, folder)
    named: set[str] = set()
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        here = "/".join(d for _, d in stack)
        first = line.split()[0]
        if first.endswith("/"):
            folder = f"{here}/{first[:-1]}".strip("/")
            named.add(folder)
            stack.append((indent, first[:-1]))
            here = folder
            line = line.replace(first, "", 1)
        code = re.sub(r"\(.*?\)", "", line)  # names inside parentheses are prose
        for name in re.findall(r"\b[\w.]+\.py\b|\b\w+/", code):
            named.add(f"{here}/{name}".strip("/").rstrip("/"))
    return named


def test_every_path_the_tree_names_exists() -> None:
    root = REPO / "src" / "divopd"
    missing = sorted(p for p in tree_paths() if not (root / p).exists())
    assert not missing, f"CONTRIBUTING.md names paths that do not exist: {missing}"


def test_the_tree_names_every_module_of_the_packages_it_details() -> None:
    named = tree_paths()
    root = REPO / "src" / "divopd"
    for package in DETAILED:
        for f in sorted((root / package).iterdir()):
            rel = f"{package}/{f.name}"
            if f.name.startswith("__") or (f.is_dir() and not (f / "__init__.py").exists()):
                continue
            assert rel in named, f"CONTRIBUTING.md's tree does not name {rel}"
