"""mkdocs hook (``hooks:`` in mkdocs.yml): the first mention on a page of a paper reference ("Table 11", "Appendix
G", "Algorithm 1", "Figure 6", ...) links to its row on ``paper.md``, which says what that table holds. Code, links,
HTML and headings are left as they are; a reference ``paper.md`` has no row for stays plain text."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

PAPER = "paper.md"
#: the anchors paper.md defines (``<span id="table-11">``)
ANCHORS = frozenset(re.findall(r'<span id="([a-z0-9-]+)">', (Path(__file__).parent / PAPER).read_text()))
REFERENCE = re.compile(r"(?<![\w/#\[-])(Algorithm 1|Equation \d+|Section \d+(?:\.\d+)?|Appendix [A-Z](?:\.\d+)?"
                       r"|Tables? \d+(?:[–-]\d+)?|Figure \d+)(?![\w\]])")
#: spans left alone inside a line: inline code, links and images, raw HTML tags, autolinks
SKIP = re.compile(r"(`+)[^`]*?\1|!?\[[^\]]*\]\([^)]*\)|<[^>]+>")
FENCE = re.compile(r"^\s*(```|~~~)")


def anchor(reference: str) -> str | None:
    """``"Tables 3–5"`` -> ``"table-3"``, ``"Appendix E.4"`` -> ``"appendix-e"``, ``"Section 4.4"`` ->
    ``"section-4"``; None when paper.md has no row for it."""
    kind, number = reference.split(" ", 1)
    kind = kind.rstrip("s").lower()
    number = re.split(r"[–.-]", number)[0].lower()
    if kind == "table" and number in ("4", "5"):
        number = "3"
    name = f"{kind}-{number}"
    return name if name in ANCHORS else None


def link_references(markdown: str, page: str) -> str:
    """``markdown`` of the page at ``page`` (relative to docs/) with each reference's first mention linked."""
    if page == PAPER:
        return markdown
    target = posixpath.relpath(PAPER, posixpath.dirname(page) or ".")
    seen: set[str] = set()

    def plain(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = anchor(match.group(1))
            if name is None or name in seen:
                return match.group(0)
            seen.add(name)
            return f"[{match.group(1)}]({target}#{name})"
        return REFERENCE.sub(one, text)

    out, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        if fenced or FENCE.match(line) or line.lstrip().startswith("#"):
            out.append(line)
            continue
        pieces, last = [], 0
        for skip in SKIP.finditer(line):
            pieces += [plain(line[last:skip.start()]), skip.group(0)]
            last = skip.end()
        out.append("".join(pieces) + plain(line[last:]))
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    return link_references(markdown, page.file.src_uri)
