"""What ships reads on its own: no tracker citations ("issue 8", "issue 17's warm start", "#12") in the code, the
packaged configs, the docs, the benchmarks, the scripts, the tests, the Makefile or the README; a reader outside the
project's tracker cannot look them up, so each place says what the setting, runner or checked behaviour is instead.
The study (study/) is the study's record and keeps its references."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"\bissues?[ -]?#?\d+", re.I)
SHIPPED = ("src", "docs", "benchmarks", "scripts", "examples", "tests")
FILES = ("Makefile", "README.md", "mkdocs.yml", "pyproject.toml")
SUFFIXES = {".py", ".yaml", ".yml", ".md", ".sh", ".toml", ".txt", ".cfg", ".json", ".jinja", ".html"}


def shipped_text_files() -> list[Path]:
    out = [REPO / f for f in FILES if (REPO / f).is_file()]
    for top in SHIPPED:
        out += [p for p in sorted((REPO / top).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                and "__pycache__" not in p.parts and "shipped" not in p.relative_to(REPO).parts[:3]]
    return [p for p in out if p != Path(__file__).resolve()]  # this file quotes the forms it looks for


def test_no_tracker_citations_in_what_ships() -> None:
    found = []
    for path in shipped_text_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if CITATION.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not found, "tracker citations (say what the thing is instead):\n" + "\n".join(found)


def test_the_pattern_catches_the_forms_seen() -> None:
    for text in ("issue 8", "Issue 17's warm start", "issue-42", "issue #12", "issues 3"):
        assert CITATION.search(text), text
    for text in ("the issue is", "tissue 3x"):
        assert not CITATION.search(text), text
