"""The divopd envs the framework integration tests play (in each framework's venv, where ``make setup-trinity`` /
``make setup-verl`` install the env packages): divopd's pure-Python ``tiny`` env and two real JVM envs,
TextWorld-Express (``twx``) and ScienceWorld, with their configs and models; and a check that no JVM outlives a test.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from divopd.train.config import TrainConfig, load_config
from divopd.train.packaged import SHIPPED
from tiny_models import build_env_models, build_tiny_models  # tests/, on the path through tests/conftest.py

__all__ = ["ENVS", "env_setting", "java_descendants", "wait_jvms_closed"]

#: The envs, in the order the tests are parametrized.
ENVS: tuple[str, ...] = ("tiny", "twx", "scienceworld")
#: ScienceWorld's task type in the tests (one JVM per env instance; its train variations are the tasks)
SCIENCEWORLD_KWARGS = {"task_names": ["find-living-thing"]}


def env_setting(env: str, out: Path, overrides: list[str]) -> tuple[TrainConfig, dict[str, str]]:
    """The config (``overrides`` applied) and the models (paths) of one env of :data:`ENVS`:

    * ``tiny``: the packaged ``tiny`` setting and random tiny models (tests/tiny_models.py);
    * ``twx``: the packaged ``coin6-dart`` setting (TextWorld-Express's coin game, 6 rooms) with the student and
      teacher the package ships for it (trained on that game with that setting's prompt: they play real actions);
    * ``scienceworld``: the packaged ``scienceworld`` setting on one task type, random tiny models whose word
      tokenizer is built from ScienceWorld's own text.
    """
    if env == "tiny":
        return load_config("tiny", ["explorer.env=tiny", "explorer.env_kwargs={}", *overrides]), \
            build_tiny_models(out)
    if env == "twx":
        shipped = SHIPPED / "coin6-dart"
        return load_config("coin6-dart", overrides), {k: str(shipped / k) for k in ("student", "teacher")}
    if env == "scienceworld":
        cfg = load_config("scienceworld", [f"explorer.env_kwargs={SCIENCEWORLD_KWARGS}", *overrides])
        return cfg, build_env_models(out, "scienceworld", SCIENCEWORLD_KWARGS)
    raise ValueError(f"unknown test env {env!r}; expected one of {ENVS}")


def java_descendants(pid: int | None = None) -> set[int]:
    """The live (not zombie) ``java`` processes below ``pid`` (default: this process), read from ``/proc``."""
    table: dict[int, tuple[int, str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        table[int(entry.name)] = (int(rest[1]), comm, rest[0])
    below, frontier = set(), {os.getpid() if pid is None else pid}
    while frontier:
        frontier = {p for p, (ppid, _, _) in table.items() if ppid in frontier} - below
        below |= frontier
    return {p for p in below if table[p][1] == "java" and table[p][2] != "Z"}


def wait_jvms_closed(before: set[int], deadline_s: float = 60.0) -> set[int]:
    """Wait (up to ``deadline_s``) until no JVM started since ``before`` runs; returns those still running."""
    end = time.monotonic() + deadline_s
    while (left := java_descendants() - before) and time.monotonic() < end:
        time.sleep(0.2)
    return left
