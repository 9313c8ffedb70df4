"""The faults page (docs/concepts/faults.md) is grouped by fault, one short table each, and names the tests of every
row in footnotes: each footnote is used by a row, each test it names exists, and no cell repeats the long "what is
left on disk" text that the page's legend says once ("kept")."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "concepts" / "faults.md"
FOOTNOTE = re.compile(r"^\[\^([\w-]+)\]: (.+)$", re.M)
#: ``file.py::test_name`` or ``::test_name`` (the file of the previous id), parametrized ids dropped
TEST_ID = re.compile(r"`(?:(test_\w+\.py))?::(test_\w+)(?:\[[^\]]*\])?`")


def footnotes() -> dict[str, str]:
    return dict(FOOTNOTE.findall(PAGE.read_text()))


def test_every_footnote_is_used_and_every_row_reference_has_a_footnote() -> None:
    text = PAGE.read_text()
    body = FOOTNOTE.sub("", text)
    used = set(re.findall(r"\[\^([\w-]+)\]", body))
    assert used and used == set(footnotes()), (used ^ set(footnotes()))


def test_every_test_the_footnotes_name_exists() -> None:
    missing = []
    for name, text in footnotes().items():
        current = None
        for file, test in TEST_ID.findall(text):
            current = file or current
            assert current, f"[^{name}]: ::{test} names no file"
            source = (REPO / "tests" / current).read_text()
            if not re.search(rf"^(?:async )?def {test}\(", source, re.M):
                missing.append(f"[^{name}]: {current}::{test}")
    assert not missing, "the faults page names tests that do not exist:\n" + "\n".join(missing)


def test_no_test_ids_and_no_repeated_disk_text_in_the_tables() -> None:
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("|")]
    assert not [r for r in rows if "test_" in r], "test ids go in the footnotes"
    assert sum("every log part whole" in r for r in rows) == 0, "say it once in the legend (kept)"
