"""User pages say what the code does and what it measures, not how the project was built: no "the machine of
2026-12-04", no commit hashes, no tracker references ("issue N", "#N"), no notes on what else ran beside a
measurement ("other jobs running", "load average 4.8"), no run-by-run clock times. A measurement's date belongs in
its table or on its "Measured DATE" line, so lines of markdown tables are not checked; code blocks are not prose
and are not checked either. Checked on the Markdown sources of docs/ and on the README.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

#: (what it is, the pattern); each is a kind of development history a reader cannot use
HISTORY: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a machine named by its day", re.compile(r"\bthe machines? of (?:\d{4}-\d\d-\d\d|the)\b", re.I)),
    ("a commit hash", re.compile(r"(?<![\w/.#=-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/.-])")),
    ("a tracker reference", re.compile(r"\bissues?[ -]?#?\d+|\bthe issue's\b|(?<![\w&/#])#\d+\b", re.I)),
    ("what ran beside a measurement", re.compile(
        r"\bother (?:jobs|helpers'?|processes|test suites)\b[^.]*\b(?:beside|running|ran)\b|\bwith other jobs\b"
        r"|\bload average\b|\bhelpers?'? jobs\b|\bbeside it\)", re.I)),
    ("a clock time of a run", re.compile(r"\b\d\d:\d\d(?:[–-]\d\d:\d\d)? UTC\b")),
    ("how the work went", re.compile(
        r"\bvalue for value on the machines?\b|\bin a fresh clone's CI\b|\bthe order before the appendix\b"
        r"|\bbefore the sampler followed\b|\bin a later session\b|\bthis project's sessions\b", re.I)),
)
FENCE = re.compile(r"^\s*(```|~~~)")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [REPO / "README.md"]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the prose: outside fenced code, not a row of a markdown table, not a comment."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("|") or line.lstrip().startswith("<!--"):
            continue
        out.append((n, line))
    return out


#: a line citing another project's tracker (``huggingface/trl#6705``): its bare ``#N`` are that project's, not ours
UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+#\d+")


def history(text: str) -> list[str]:
    """One entry per development-history phrase in ``text``'s prose: ``LINE: what: phrase``."""
    found = []
    for n, line in prose_lines(text):
        for what, pattern in HISTORY:
            for match in pattern.finditer(line):
                if match.group(0).startswith("#") and UPSTREAM.search(line):
                    continue
                found.append(f"{n}: {what}: {match.group(0)!r}")
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_development_history_on_user_pages(page: Path) -> None:
    found = history(page.read_text())
    assert not found, (f"{page.relative_to(REPO)} narrates how it was built (say what the code does, or move the "
                       "date into the measurement's table or 'Measured DATE' line):\n" + "\n".join(found))


def test_the_patterns_catch_the_forms_seen_and_spare_measurement_tables() -> None:
    caught = (
        "383 s from a fresh clone on the machine of 2026-12-04, with other jobs beside it)",
        "A fresh clone repeated these value for value on the machines of 2026-12-03 and 2026-12-04.",
        "On 2026-12-06, in a fresh clone's CI, `make test-verl` took 9 minutes",
        "(`arrival`, the order before the appendix)",
        "Before: the strategy as of commit ea8c9a5 (one `Turn` built per record)",
        "(The issue's first measurement, before the plug-ins' reads stopped waiting: 1,138 ms)",
        "Measured 2026-12-06 04:05–04:11 UTC on the shared 2-core machine",
        "(load average 2.7–7.9, other helpers' jobs and test suites running)",
        "on the 2-core machine with other jobs running, so wall times are indicative only",
        "see " + "issue" + " 17 and #12",  # split: tests/test_no_tracker_refs.py scans this file too
        "other helpers' jobs",
    )
    for text in caught:
        assert history(text), text
    spared = (
        "Measured 2026-12-06, `--arrival 1.0`:",
        "| trinity | 64 | preloaded | 40 | 8.0 (9.7) | 9.3 (12.1) | 13.4 | yes | 64, 70 |",
        "```\ngit log --oneline  # 0c6b7ef the commit\n```",
        "the sampler's numpy columns (a cafe 1,024-turn pool), `#the-demo` anchors and [link](index.md#the-demo)",
        "a batch of B = 256 turns; SHA-256 of the file; 2026-12-05 on a 2-core CPU",
        "Other helpers: `write_log(path, ...)`",
        "its introduction, huggingface/trl#6705, and two sync passes, #6823 and #6987",
    )
    for text in spared:
        assert not history(text), (text, history(text))
