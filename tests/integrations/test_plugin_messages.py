"""The troubleshooting page's section on ``divopd tasks`` and the framework plug-ins quotes lines the code prints: each
quoted line has an entry here, and each entry's code fragments are in divopd's source. Two are produced here too."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from divopd.errors import UsageError
from divopd.experience.log import ExperienceLogWriter
from divopd.integrations.dispatch import ArrivalDispatch
from divopd.integrations.plugin_log import PluginLog
from test_faults_killrec import _turn  # tests/, on the path through tests/conftest.py

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## `divopd tasks` and the framework plug-ins"

#: a fragment of a quoted line -> fragments of the code that prints it
MESSAGES: dict[str, tuple[str, ...]] = {
    "is not set up here: ALFWORLD_DATA is not set": (
        "is not set up here: {one_line(exc, 1000)}",
        "ALFWORLD_DATA is not set and no data_dir was given. {_SETUP_HELP}",
        "install the extra with `pip install 'divopd[alfworld]'`, run "),
    "no WebShop server answers at": ("cannot build the environment to list its tasks: ",
                                     "no WebShop server answers at"),
    "split_scheme 'paper' has only 'train' and 'test'": ("cannot list it: {one_line(exc, 300)}",
                                                         "has only 'train' and 'test' (the held-out list)"),
    "exists; divopd never overwrites a file": ("exists; divopd never overwrites a file (remove it or choose another "
                                               "path)",),
    "exists and is not a directory": ("exists and is not a directory",),
    "a Trinity taskset file ends in .jsonl": ("a Trinity taskset file ends in .jsonl (name it after its split: ",),
    "verl's dataset files are parquet": ("verl's dataset files are parquet (name it train.parquet / val.parquet)",),
    "cannot load its task writer": ("cannot load its task writer {FORMATS[framework]} ",),
    "unknown key 'x' for sample_strategy 'divopd'": ("unknown key {unknown[0]!r} for sample_strategy ",),
    "target_arrival_ratio: a number >= 1": ("{where}.target_arrival_ratio: a number >= 1 (turns generated per trained "
                                            "turn), got ",),
    "cannot write the experience log there": ("{where}.experience_dir {directory!r}: cannot write the experience log "
                                              "there ",),
    "already holds an earlier run's experience log": (),  # produced below
    "holds files divopd did not write": (": holds files divopd did not write ",
                                         "; give this run a new or empty experience_dir"),
    "reads a queue experience buffer": (" reads a queue experience buffer: set ",),
    "sampler_kwargs: unknown key(s)": ("trainer.v1.sampler.sampler_kwargs: unknown key(s) {unknown}; known: ",),
    "sampler_kwargs.dispatch: one of": ("trainer.v1.sampler.sampler_kwargs.dispatch: one of ",),
    "max_off_policy_strategy=wait": ("max_off_policy_strategy=wait: DivOPDReplayBuffer expires stale",),
    "has no extra_info.divopd_task": (": the dataset row has no extra_info.divopd_task: make the data files with ",),
    "no policy version: its tag needs min_global_steps": ("no policy version: its tag needs min_global_steps (the "
                                                          "weights version that ",),
    "DivOPD selects per turn and needs the rollout id": ("DivOPD selects per turn and needs the rollout id ",),
    "outside [1, 4]": (),  # produced below
    "the composer is starved and waits": (),  # produced below
}


def _source() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "src" / "divopd").rglob("*.py"))


def _quoted() -> list[str]:
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    bodies = re.findall(r"```log[^\n]*\n(.*?)```", section, re.S)
    return [line for body in bodies for line in body.splitlines() if line.strip()]


def test_every_quoted_line_has_its_code() -> None:
    quoted = _quoted()
    assert len(quoted) >= 15
    unmapped = [line for line in quoted if not any(fragment in line for fragment in MESSAGES)]
    assert not unmapped, unmapped
    source = " ".join(_source().split())
    missing = [(f, c) for f, codes in MESSAGES.items() for c in codes if " ".join(c.split()) not in source]
    assert not missing, missing
    assert all(any(f in line for line in quoted) for f in MESSAGES), "stale entries"


def test_the_dispatch_warnings_are_the_quoted_lines(caplog: pytest.LogCaptureFixture) -> None:
    rule = ArrivalDispatch(batch_size=64, horizon=30, config_hint="buffer.batch_size: {value} (tasks per explore "
                           "step; divide it by algorithm.repeat_times)")
    lines = []
    for step in range(5):
        rule.observe([f"{step}-{i}" for i in range(16) for _ in range(30)])
        rule.step_metrics(expired=0)
        lines += rule.warnings("sample_strategy divopd")
    starved = ArrivalDispatch(batch_size=64, horizon=30)
    for step in range(3):
        starved.observe([f"{step}-{i}" for i in range(32)])
        starved.step_metrics(expired=0)
        lines += starved.warnings("DivOPDReplayBuffer")
    quoted = _quoted()
    assert lines[0] in quoted, lines[0]
    assert lines[1].replace("step 2: 32 turns", "step N: K turns") in quoted, lines[1]
    logging.getLogger(__name__).info("%s", lines)



def test_the_experience_dir_refusal_is_the_quoted_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the verl example's relative path, holding the log of a run before
    log = Path("runs/scienceworld-divopd/experience")
    ExperienceLogWriter(log).extend([_turn("r")], arrival_update=0)
    with pytest.raises(UsageError) as err:
        PluginLog(log, "trainer.v1.sampler.sampler_kwargs", "verl")
    assert str(err.value) in _quoted(), str(err.value)
