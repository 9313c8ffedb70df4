"""mkdocs hook (``hooks:`` in mkdocs.yml): the code's docstrings cross-reference with Sphinx roles (``:func:`x```,
``:class:`~a.B```), which the API pages render as a literal ``:func:`` before the code span. Drop the role and a
leading ``~`` (Sphinx's "show the last part only" becomes the last dotted part)."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def _code(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(_code, html)
