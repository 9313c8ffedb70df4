"""The part files of a training run's experience log: numbered in numeric order at any count, and
compacted at each checkpoint into one file per interval, whole or not at all: a kill at any moment of a compaction
leaves every row once in the log (never twice, never lost).

Writer tests on small logs; the kill is a real child process that SIGKILLs itself between a compaction's steps
(``DIVOPD_SIGKILL_AT=compact-write`` / ``compact-remove``); one real lockstep run checks the file count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from divopd.experience.log import ExperienceLogWriter, compact_parts, part_files, read_log
from divopd.train import train
from test_faults_killrec import _turn
from test_train import assert_ledger_identity, tiny_config, tiny_models  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def _arrivals(d: Path) -> list[int]:
    return [x.arrival for x in read_log(d)]


def test_a_writer_past_part_999999_continues_in_numeric_order(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    w = ExperienceLogWriter(d, write_ids=True)
    for i in range(3):  # parts 0, 1, 2, renamed below to the numbers around the 6-digit limit
        w.extend([_turn(f"r{i}")], arrival_update=i)
    for i, n in enumerate((999_998, 999_999, 1_000_000)):
        os.rename(d / f"part-{i:06d}.parquet", d / f"part-{n:06d}.parquet")
    assert [p.name for p in part_files(d)] == ["part-999998.parquet", "part-999999.parquet", "part-1000000.parquet"]
    assert _arrivals(d) == [0, 1, 2]
    w2 = ExperienceLogWriter(d, write_ids=True)  # a resumed run's writer
    assert w2.next_arrival == 3
    w2.extend([_turn("r3")], arrival_update=3)
    assert (d / "part-1000001.parquet").is_file()
    assert _arrivals(d) == [0, 1, 2, 3]
    assert w2.compact() is not None
    assert [p.name for p in part_files(d)] == ["part-999998-1000001.parquet"]
    assert _arrivals(d) == [0, 1, 2, 3]


def test_compaction_merges_each_interval_into_one_file(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    w = ExperienceLogWriter(d, write_ids=True)
    for i in range(5):
        w.extend([_turn(f"a{i}", 0), _turn(f"a{i}", 1)], arrival_update=0)
    assert w.compact() == d / "part-000000-000004.parquet"
    for i in range(3):
        w.extend([_turn(f"b{i}")], arrival_update=1)
    w.compact()
    w.extend([_turn("c")], arrival_update=2)
    assert [p.name for p in part_files(d)] == ["part-000000-000004.parquet", "part-000005-000007.parquet",
                                               "part-000008.parquet"]
    assert _arrivals(d) == list(range(14))
    assert w.compact() is None  # one part: nothing to merge


_CHILD = """
import sys
import numpy as np
from divopd import Turn
from divopd.experience.log import ExperienceLogWriter

def turn(i):
    n = 3
    return Turn(rollout_id=f"r{i}", turn_index=0, policy_version=0, prompt_ids=np.arange(4, dtype=np.int32),
                response_ids=np.arange(n, dtype=np.int32), action_mask=np.ones(n, dtype=bool),
                student_logprobs=np.zeros(n, dtype=np.float32), teacher_logprobs=np.zeros(n, dtype=np.float32),
                teacher_valid_mask=np.ones(n, dtype=bool))

w = ExperienceLogWriter(sys.argv[1], write_ids=True)
for i in range(6):
    w.extend([turn(i)], arrival_update=0)
w.compact()
"""


@pytest.mark.parametrize("phase", ["compact-write", "compact-remove"])
def test_a_kill_inside_a_compaction_loses_and_duplicates_nothing(tmp_path: Path, phase: str) -> None:
    d = tmp_path / "experience"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "DIVOPD_SIGKILL_AT": phase}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(d)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -9, proc.stderr
    names = sorted(p.name for p in d.iterdir())
    if phase == "compact-write":  # the merged file written, not renamed: the inputs are the log
        assert "part-000000-000005.parquet.tmp" in names and "part-000000-000005.parquet" not in names
    else:  # renamed, inputs not removed yet: the merged file is the log, the inputs are covered
        assert "part-000000-000005.parquet" in names and "part-000003.parquet" in names
    assert _arrivals(d) == list(range(6))  # readers: every row once
    w = ExperienceLogWriter(d, write_ids=True)  # the next session's writer cleans up and continues
    w.extend([_turn("next")], arrival_update=1)
    w.compact()
    assert _arrivals(d) == list(range(7))
    assert [p.name for p in part_files(d)] == sorted(p.name for p in d.iterdir())  # nothing left over
    assert len(part_files(d)) <= 2


def test_a_compacted_part_outranks_the_inputs_it_covers(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    w = ExperienceLogWriter(d, write_ids=True)
    for i in range(4):
        w.extend([_turn(f"r{i}")], arrival_update=0)
    inputs = {p.name: p.read_bytes() for p in part_files(d)}
    merged = compact_parts(d)
    for name, data in inputs.items():  # as a kill between the rename and the removals leaves them
        (d / name).write_bytes(data)
    assert [p.name for p in part_files(d)] == [merged.name]
    assert _arrivals(d) == [0, 1, 2, 3]


def test_a_run_keeps_about_one_log_file_per_checkpoint_interval(tiny_models: dict[str, str],  # noqa: F811
                                                                tmp_path: Path) -> None:
    run = tmp_path / "run"
    summary = train(tiny_config(tiny_models, run, "divopd", updates=6, **{
        "runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6, "checkpoint.every": 2}))
    assert_ledger_identity(summary["ledger"])
    files = [p.name for p in (run / "experience").iterdir()]
    assert len(files) <= 6 // 2 + 1, files  # one compacted file per checkpoint (the final one's included)
    assert summary["ledger"]["received"] == len(_arrivals(run / "experience")) == summary["turns"]
