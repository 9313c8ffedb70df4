"""The docs site's tables and code blocks fit the content column (issue: the site as a reader sees it), checked on the
Markdown sources without a browser.

The column: measured in headless Chromium (``scripts/screenshot-docs.py``) at 1,280 and 1,400 px windows, the article
column is 748 px. mkdocs-material sets the root font to 20 px below 100em, body text to 0.8 rem (16 px) and code to
0.85 em of that (13.6 px); a code block's padding is 1.1765 em (16 px) on each side, so 716 px hold text. A monospace
character advances 0.6 em (Roboto Mono; DejaVu Sans Mono, the local fallback, 0.602 em): 8.19 px, so 716 / 8.19 =
87 characters a line (``docs/gen_reference.CODE_CHARS``; the CLI page's ``--help`` text is wrapped to it). A block
inside a list item sits in a box 30 px narrower (718 px, measured): 83 characters.
Blocks marked ``{.wrap}`` (error lines on the troubleshooting page) wrap in the browser (docs/stylesheets/extra.css)
and are exempt.

Tables: a code span in a table's first column does not break (extra.css keeps key names whole); material breaks any
other code span anywhere (``word-break: break-word``). Table text is 0.64 rem (12.8 px), code 0.85 em of it (10.9 px,
6.55 px a character): a 50-character unbreakable span is 328 px, under half the column, so the other columns keep
room; longer config defaults move to a list under the table (``gen_reference.LONG_DEFAULT``). A table's narrowest
layout is the sum over columns of its longest unbreakable word (plain text ~6.6 px a character, code spans outside the
first column break, and neither do the config reference's defaults: extra.css breaks them only between words) plus
the cells' side padding (extra.css); it must fit the 748 px column.
"""

from __future__ import annotations

import html
import importlib.util
import math
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

CODE_CHARS = gen.CODE_CHARS
#: a monospace character in a code block (px), and how much narrower a list level makes a block's box (px)
CHAR_PX = 8.19
LIST_INDENT_PX = 30
TABLE_SPAN = 50
COLUMN_PX = 748
CSS = (REPO / "docs" / "stylesheets" / "extra.css").read_text()
#: a cell's side padding in px (extra.css's `padding: V H` for table cells, in em of the 12.8 px table text)
CELL_PAD_PX = 2 * 12.8 * float(re.search(r"td \{\s*padding: [\d.]+em ([\d.]+)em", CSS).group(1))
#: extra.css keeps a cell's only code span whole (the rule this check was written against: it widened tables)
ONLY_CHILD_NOWRAP = "td > code:only-child" in CSS
FENCE = re.compile(r"^( *)(```+)([^\n]*)\n(.*?)^\1\2 *$", re.S | re.M)


def pages() -> list[Path]:
    return sorted((REPO / "docs").rglob("*.md"))


def code_chars(indent: int) -> int:
    """Characters a code line may hold in a block indented by ``indent`` spaces: each list level (4 spaces) narrows
    the box by ``LIST_INDENT_PX`` (a block in a numbered list: 718 px against 748, measured by screenshot-docs.py)."""
    return CODE_CHARS - math.ceil(LIST_INDENT_PX * (indent // 4) / CHAR_PX)


def long_code_lines(text: str) -> list[str]:
    """Lines of non-wrapping fenced code blocks longer than their budget (``CODE_CHARS``, less in a list item)."""
    out = []
    for m in FENCE.finditer(text):
        if ".wrap" in m.group(3):
            continue
        budget = code_chars(len(m.group(1)))
        for line in m.group(4).split("\n"):
            line = line[len(m.group(1)):]
            if len(line) > budget:
                out.append(f"[{len(line)} > {budget}] {line}")
    return out


def unbreakable_spans(text: str) -> list[str]:
    """Spans of table cells the browser cannot break, longer than ``TABLE_SPAN`` characters."""
    out = []
    rows = text.split("\n")
    for row, after in zip(rows, [*rows[1:], ""], strict=True):
        header = after.startswith("|") and set(after) <= set("|-: ")  # th above the separator: code there breaks
        if not row.startswith("|") or set(row) <= set("|-: ") or header:
            continue
        for i, cell in enumerate(_cells(row)):
            spans = re.findall(r"`([^`]*)`", cell)
            only = len(spans) == 1 and not re.search(r"\[|<br>|\*\*", cell)  # :only-child ignores text nodes
            if i == 0 or (ONLY_CHILD_NOWRAP and only):  # whole in extra.css; material breaks others anywhere
                out += [f"[{len(s)}] {s}" for s in map(html.unescape, spans) if len(s) > TABLE_SPAN]
        plain = html.unescape(re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", " ", row)))  # link targets: not shown
        out += [f"[{len(w)}] {w}" for w in plain.split() if len(w) > TABLE_SPAN]
    return out


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def narrowest_tables(text: str) -> list[str]:
    """Tables whose narrowest layout (see the module docstring) is wider than ``COLUMN_PX``."""
    out, table, keys = [], [], False
    for row in [*text.split("\n"), ""]:
        if row.startswith("|"):
            table.append(row)
            continue
        widths: dict[int, int] = {}
        for r in table:
            if set(r) <= set("|-: "):
                continue
            for i, cell in enumerate(_cells(re.sub(r"\]\([^)]*\)", "]", r))):  # link targets are not shown
                if i and not (keys and i == 2):  # a config default (div.config-keys) breaks only between words
                    cell = re.sub(r"`[^`]*`", "x", cell)
                cell = html.unescape(cell.replace("`", "").replace("**", "").replace("<br>", " "))
                words = re.split(r"[\s/]+", cell)  # Chromium breaks after a slash too
                widths[i] = max(widths.get(i, 0), max((len(w) for w in words), default=0))
        px = sum(w * 6.6 + CELL_PAD_PX for w in widths.values())
        if px > COLUMN_PX:
            out.append(f"[{px:.0f} px] {table[0][:90]}")
        table = []
        keys = row.startswith('<div class="config-keys"') or (keys and not row.startswith("</div>"))
    return out


def test_code_block_lines_fit_the_column() -> None:
    problems = []
    for path in pages():
        name = str(path.relative_to(REPO))
        problems += [f"{name}: {line}" for line in long_code_lines(path.read_text())]
    assert not problems, (f"code lines past {CODE_CHARS} characters (the 748 px column; "
                          f"{code_chars(4)} in a list item):\n" + "\n".join(problems))


def test_table_cells_have_no_long_unbreakable_span() -> None:
    problems = [f"{p.relative_to(REPO)}: {s}" for p in pages() for s in unbreakable_spans(p.read_text())]
    assert not problems, "table cells the browser cannot wrap:\n" + "\n".join(problems)


def test_tables_fit_the_column_at_their_narrowest() -> None:
    problems = [f"{p.relative_to(REPO)}: {t}" for p in pages() for t in narrowest_tables(p.read_text())]
    assert not problems, f"tables wider than the {COLUMN_PX} px column however they wrap:\n" + "\n".join(problems)


def test_long_config_defaults_move_under_the_table() -> None:
    page = gen.config_page()
    system = next(r for r in page.split("\n") if r.startswith("| `explorer.prompt.system`"))
    assert "below the table" in system
    assert "- `explorer.prompt.system` defaults to `" in page
    assert not unbreakable_spans(page)


def test_the_checks_catch_what_they_claim() -> None:
    assert long_code_lines("```bash\n" + "x" * (CODE_CHARS + 1) + "\n```\n")
    assert not long_code_lines("```text {.wrap}\n" + "x" * 200 + "\n```\n")
    nested = "1. item\n\n    ```yaml\n    " + "x" * (CODE_CHARS - 2) + "\n    ```\n"
    assert long_code_lines(nested) and code_chars(4) == 83  # in a list item: 718 px hold 83 characters
    assert unbreakable_spans("| `" + "a" * 60 + "` | x |\n")  # first-column code: nowrap
    assert not unbreakable_spans("| `k` | see `" + "a" * 80 + "` |\n")  # inside prose it breaks
    assert narrowest_tables("| a | b |\n|---|---|\n| " + " | ".join(["abcdefghij"] * 12) + " |\n")
    wide_default = "| k | t | `" + "d" * 120 + "` | m |\n"
    assert not narrowest_tables(wide_default)  # a code span outside the first column breaks anywhere
    assert narrowest_tables(f'<div class="config-keys" markdown>\n\n{wide_default}')  # a config default does not
