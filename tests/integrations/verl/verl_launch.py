"""The verl example's launch lines (``examples/verl/*.sh``), read from the script itself: the one place that the
example test and the trainer-path test take verl's Hydra overrides from. Imports nothing from verl."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples" / "verl").glob("*.sh"))
#: The ScienceWorld launch script (docs/integrations/verl.md shows its lines).
SCIENCEWORLD = ROOT / "examples" / "verl" / "run_divopd_scienceworld.sh"


def read_script(path: Path) -> tuple[list[str], list[list[str]]]:
    """The launch command's ``key=value`` overrides and the ``divopd tasks`` commands, shell variables expanded."""
    text = path.read_text()
    assigned = dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, re.M))

    def expand(word: str) -> str:
        return re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: assigned[m.group(1)], word)

    logical = text.replace("\\\n", " ").splitlines()
    launch = [line for line in logical if "verl.trainer.main_ppo" in line]
    assert len(launch) == 1, f"{path.name}: one `python -m verl.trainer.main_ppo` line"
    words = [expand(w) for w in shlex.split(launch[0].split("verl.trainer.main_ppo", 1)[1])]
    overrides = [w for w in words if w != "$@"]
    assert all("=" in w for w in overrides), overrides
    tasks = [[expand(w) for w in shlex.split(line[line.index("divopd tasks"):])]
             for line in logical if "divopd tasks" in line and not line.lstrip().startswith("#")]
    return overrides, tasks


def with_values(overrides: list[str], values: dict[str, str]) -> list[str]:
    """``overrides`` with the value of each key in ``values`` replaced (keys compared without Hydra's ``+``); a key
    that the list lacks is appended (with ``+`` where ``values`` spells it so)."""
    pending = dict(values)
    out = []
    for line in overrides:
        key, _, _ = line.partition("=")
        bare = key.lstrip("+")
        match = next((k for k in pending if k.lstrip("+") == bare), None)
        out.append(f"{key}={pending.pop(match)}" if match is not None else line)
    return out + [f"{k}={v}" for k, v in pending.items()]
