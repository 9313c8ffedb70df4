"""The framework plug-ins' ``experience_dir`` (divopd.integrations.plugin_log): a fresh run refuses a directory that
holds an earlier run's log (one line naming it and what to do) and leaves every file as it was; the run its framework
resumes continues its own log, cut back to the checkpoint, with arrival numbers that go on from the log's; files divopd
did not write are never touched. The frameworks' own resume signals are tested in their venvs
(tests/integrations/trinity/test_plugin_log.py, tests/integrations/verl/test_verl_log_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from divopd.errors import UsageError
from divopd.experience.log import ExperienceLogWriter, first_arrival_at_update, read_log
from divopd.integrations.plugin_log import MARKER, PluginLog
from divopd.integrations.plugin_run import PluginRun
from test_faults_killrec import _turn

WHERE = "trainer.v1.sampler.sampler_kwargs"


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _session(d: Path, run: str | None, updates: range, per_update: int = 3, resume_update: int | None = None,
             first_arrival: int = 0) -> PluginRun:
    """A plug-in session: ``per_update`` turns received at each learner version of ``updates``, numbered by a sampler
    that starts at ``first_arrival`` (0: a fresh sampler, as verl's buffer after a resume)."""
    plugin = PluginRun({"experience_dir": str(d)}, 4, "DivOPDReplayBuffer", WHERE, framework="verl", run=run)
    plugin.start(resume_update=resume_update, next_arrival=first_arrival)
    arrival = first_arrival
    for u in updates:
        turns = [_turn(f"s{run}-u{u}-{i}") for i in range(per_update)]
        plugin.observe([t.rollout_id for t in turns], list(range(arrival, arrival + per_update)), u, lambda t=turns: t)
        arrival += per_update
    return plugin


def test_a_fresh_run_refuses_a_directory_that_holds_a_log_and_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "runs" / "sw" / "experience"
    _session(d, None, range(3))  # the first run (no checkpoint folder known)
    before = _snapshot(d)
    for run in (None, "/ckpt/a"):  # the same command again, or another run
        with pytest.raises(UsageError) as err:
            _session(d, run, range(2))
        line = str(err.value)
        assert "\n" not in line and str(d) in line
        assert "already holds an earlier run's experience log" in line
        assert "give this run a new experience_dir, or remove" in line
    assert _snapshot(d) == before
    assert [x.arrival for x in read_log(d)] == list(range(9))


def test_the_same_run_started_afresh_is_refused_when_it_opens_its_log(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    _session(d, "/ckpt/a", range(3))
    before = _snapshot(d)
    log = PluginLog(d, WHERE, "verl", run="/ckpt/a")  # its own log: the framework decides at start
    assert log.held
    with pytest.raises(UsageError, match="is not resuming that run from a checkpoint"):
        log.start()
    assert _snapshot(d) == before


def test_a_resumed_run_continues_its_log_cut_back_to_the_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    _session(d, "/ckpt/a", range(6))  # versions 0..5; the framework's checkpoint is at step 4 (versions 0..3 trained)
    assert first_arrival_at_update(d, 4) == 12
    resumed = _session(d, "/ckpt/a", range(4, 7), resume_update=4)  # its sampler numbers from 0 again
    assert resumed.experience.truncated == 6 and resumed.experience.offset == 12
    logged = list(read_log(d))
    assert [x.arrival for x in logged] == list(range(21))  # no gap, no repeat
    assert [x.arrival_update for x in logged] == [u for u in range(7) for _ in range(3)]
    assert all(x.turn.rollout_id.startswith("s/ckpt/a-u") for x in logged)
    assert json.loads((d / MARKER).read_text()) == {"framework": "verl", "run": "/ckpt/a"}


def test_a_resume_by_arrival_keeps_the_restored_samplers_numbers(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    _session(d, "/job", range(5))  # 15 turns; the checkpoint's sampler had received 9
    log = PluginLog(d, WHERE, "Trinity-RFT", run="/job")
    log.start(resume_arrival=9, next_arrival=9)
    assert log.truncated == 6 and log.offset == 0 and log.writer.next_arrival == 9


def test_another_runs_log_is_refused_even_when_resuming(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    _session(d, "/ckpt/a", range(2))
    before = _snapshot(d)
    with pytest.raises(UsageError, match="already holds an earlier run's experience log"):
        _session(d, "/ckpt/b", range(2, 4), resume_update=2)
    assert _snapshot(d) == before


def test_files_divopd_did_not_write_are_never_touched(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    ExperienceLogWriter(tmp_path / "elsewhere").extend([_turn("x")], arrival_update=0)
    for resume in (None, 3):
        with pytest.raises(UsageError, match=r"holds files divopd did not write \(notes.txt\)"):
            _session(d, "/ckpt/a", range(1), resume_update=resume)
    assert _snapshot(d) == {"notes.txt": b"mine"}
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        PluginLog(tmp_path / "a-file", WHERE, "verl")


def test_a_directory_with_a_marker_and_no_turns_is_reused(tmp_path: Path) -> None:
    d = tmp_path / "experience"
    PluginLog(d, WHERE, "verl", run="/ckpt/old").start()  # a run that stopped before its first turn
    assert (d / MARKER).is_file() and not list(d.glob("part-*"))
    _session(d, "/ckpt/new", range(2))
    assert [x.arrival for x in read_log(d)] == list(range(6))
    assert json.loads((d / MARKER).read_text())["run"] == "/ckpt/new"
