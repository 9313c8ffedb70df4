"""Every install command the docs and the README quote names an extra that pyproject.toml defines: ``pip install
'divopd[scienceworld]'`` reads as right and fails (``divopd[envs]`` holds scienceworld). Checked on every
``divopd[EXTRA]`` and ``.[EXTRA]`` in docs/, the README and the messages of src/ (which the docs quote)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: ``divopd[a,b]``, ``.[a]``, ``-e '.[a]'``: the package (or the checkout) and its extras
EXTRAS = re.compile(r"(?:\bdivopd|(?<![\w\]])\.)\[([\w,\s-]+)\]")


def extras() -> set[str]:
    """The names of pyproject.toml's ``[project.optional-dependencies]`` (read without tomllib: Python 3.10)."""
    section = (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1]
    section = re.split(r"^\[", section, maxsplit=1, flags=re.M)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, re.M))


def files() -> list[Path]:
    return sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"] + sorted((REPO / "src").rglob("*.py"))


def unknown_extras(text: str, known: set[str]) -> list[str]:
    """``divopd[x]`` / ``.[x]`` mentions in ``text`` that name an extra not in ``known``."""
    return [match.group(0) for match in EXTRAS.finditer(text)
            if any(name.strip() not in known for name in match.group(1).split(","))]


def test_every_quoted_extra_exists() -> None:
    known = extras()
    found = [f"{path.relative_to(REPO)}: {bad}" for path in files() for bad in unknown_extras(path.read_text(), known)]
    assert not found, f"extras pyproject.toml does not define ({sorted(known)}):\n" + "\n".join(found)


def test_the_check_sees_every_form() -> None:
    known = {"envs", "ray", "dev"}
    assert unknown_extras("pip install 'divopd[scienceworld]'", known) == ["divopd[scienceworld]"]
    assert unknown_extras("pip install -e '.[envs,vllm]'", known) == [".[envs,vllm]"]
    assert unknown_extras("`'.[alfworld]'`, pip install 'divopd[ray]'", known) == [".[alfworld]"]
    assert not unknown_extras("pip install '.[envs]' or 'divopd[envs, ray]'; a[0] and x.[y]", known)
    assert {"envs", "ray", "vllm", "alfworld", "dev"} <= extras()
