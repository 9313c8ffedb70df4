"""The paper's tables on docs/paper.md and the hook that links a page's first mention of each to its row
(docs/paper_links.py): every "Table N" / "Appendix X" / "Algorithm 1" the pages mention has a row, and the hook links
the first mention only, never inside code, links or headings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
_spec = importlib.util.spec_from_file_location("paper_links", DOCS / "paper_links.py")
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)


def test_every_paper_reference_of_the_pages_has_a_row() -> None:
    missing = set()
    for page in DOCS.rglob("*.md"):
        for line in page.read_text().splitlines():
            for match in hook.REFERENCE.finditer(line):
                if hook.anchor(match.group(1)) is None:
                    missing.add(f"{page.relative_to(DOCS)}: {match.group(1)}")
    assert not missing, "add a row to docs/paper.md for:\n" + "\n".join(sorted(missing))


def test_the_first_mention_is_linked_and_code_links_and_headings_are_not() -> None:
    text = ("## Table 11 in a heading\n"
            "`Table 11` in code, [Table 11](x.md) a link, then Table 11 and Table 11 again; Appendix Table 6,\n"
            "Tables 3–5, Appendix G.\n"
            "```\nAlgorithm 1\n```\n"
            "Algorithm 1 and Table 99.")
    out = hook.link_references(text, "guides/x.md").splitlines()
    assert out[0] == "## Table 11 in a heading"
    assert out[1] == ("`Table 11` in code, [Table 11](x.md) a link, then [Table 11](../paper.md#table-11) and "
                      "Table 11 again; Appendix [Table 6](../paper.md#table-6),")
    assert out[2] == "[Tables 3–5](../paper.md#table-3), [Appendix G](../paper.md#appendix-g)."
    assert out[4] == "Algorithm 1"
    assert out[6] == "[Algorithm 1](../paper.md#algorithm-1) and Table 99."
    assert hook.link_references("Table 11", "paper.md") == "Table 11"
