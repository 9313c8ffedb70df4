"""The GPU install lines of the integration pages resolve: each page's first install block (its ``pip install`` /
``uv pip install`` lines, read from the page) is compiled by ``uv pip compile`` for Linux x86-64 / CPython 3.11 against
the package index, and the resolution holds the framework, its vLLM and what divopd's plug-in imports.

Slow (it needs the network index and uv: ``pip install uv``); ``tests/integrations/data/install/*.txt`` keep the
resolution the pages quote, and a fast test checks that the pages' version numbers are the ones in those files.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "install"
#: page -> (the packages its resolution must hold, the packages the page quotes with their version)
PAGES = {
    "trinity": ({"trinity-rft", "vllm", "verl", "torch", "transformers", "divopd", "scienceworld"},
                ("trinity-rft", "verl", "vllm", "torch", "transformers", "numpy")),
    "verl": ({"verl", "vllm", "transferqueue", "torch", "numpy", "pyarrow", "pydantic", "pyyaml", "scienceworld"},
             ("verl", "vllm", "torch", "transformers", "transferqueue")),
}
PLATFORM = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]


def gpu_install_lines(page: str) -> list[list[str]]:
    """The install commands of the page's first fenced bash block in its Install section (the GPU lines)."""
    text = (ROOT / "docs" / "integrations" / f"{page}.md").read_text()
    section = text.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    return [shlex.split(line) for line in lines if re.match(r"\s*(uv )?pip install", line)]


def requirements(commands: list[list[str]]) -> tuple[list[str], list[str]]:
    """(requirement lines, uv options) of the install commands; a ``--no-deps`` command adds nothing to resolve."""
    reqs: list[str] = []
    opts: list[str] = []
    for words in commands:
        args = words[words.index("install") + 1:]
        if "--no-deps" in args:
            continue
        it = iter(args)
        for word in it:
            if word in ("-c", "--override"):
                opts += [word, str(ROOT / next(it))]
            elif word == "-e":
                spec = next(it)
                extras = spec[1:] if spec.startswith(".") else ""
                reqs.append(f"divopd{extras} @ {ROOT.as_uri()}")
            else:
                reqs.append(word)
    return reqs, opts


def pins(text: str) -> dict[str, str]:
    found = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M))
    found.update({name: "local" for name in re.findall(r"^([A-Za-z0-9_.-]+) @ ", text, re.M)})
    return {k.lower(): v for k, v in found.items()}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_page_quotes_the_committed_resolution(page: str) -> None:
    resolved = pins((DATA / f"{page}.txt").read_text())
    text = (ROOT / "docs" / "integrations" / f"{page}.md").read_text()
    quoted = text.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    for name in PAGES[page][1]:
        spelled = {"transferqueue": "TransferQueue"}.get(name, name)
        assert f"{spelled} {resolved[name]}" in quoted, (page, name, resolved[name])
    assert gpu_install_lines(page), page
    assert all("divopd[vllm]" not in " ".join(c) and ".[vllm" not in " ".join(c) for c in gpu_install_lines(page))


def _uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    if subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "uv"]
    pytest.skip("uv is not installed (pip install uv)")


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_gpu_install_lines_resolve(page: str, tmp_path: Path) -> None:
    reqs, opts = requirements(gpu_install_lines(page))
    (tmp_path / "in.txt").write_text("\n".join(reqs) + "\n")
    done = subprocess.run([*_uv(), "pip", "compile", *PLATFORM, "--no-annotate", "--no-header", *opts,
                           str(tmp_path / "in.txt")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and re.search(r"Failed to fetch|dns error|Connection refused|timed out", done.stderr):
        pytest.skip(f"no package index reachable: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    resolved = pins(done.stdout)
    assert PAGES[page][0] <= set(resolved), PAGES[page][0] - set(resolved)
    committed = pins((DATA / f"{page}.txt").read_text())
    for name in PAGES[page][1]:
        assert resolved[name] == committed[name], (name, resolved[name], committed[name])
