"""Ctrl-C / SIGTERM: a stop request at every phase of a run checkpoints and exits 130.

Each phase is hit deterministically with the ``DIVOPD_SIGINT_AT=phase[:n]`` fault point, which sends the process a
real SIGINT from inside that phase (from the evaluator thread for ``eval``); the real-signal-from-outside case is
``test_train.py::test_ctrl_c_checkpoints_and_exits``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from divopd import cli
from divopd.train import interrupt
from divopd.train.interrupt import EXIT_INTERRUPTED, PHASES, StopRequest, fault_point
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

UPDATES = 12


def reset_fault_points() -> None:
    """Forget how often each phase was reached (several commands in one process)."""
    with interrupt._reached_lock:
        interrupt._reached.clear()


def test_stop_request_sets_a_flag_then_a_second_signal_raises() -> None:
    before = signal.getsignal(signal.SIGINT)
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)  # handled between bytecodes: no exception, only the flag
        assert stop.requested and stop.signal == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # give the interpreter bytecodes at which to run the handler
                pass
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_is_a_stop_request_too() -> None:
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal == signal.SIGTERM


def test_fault_point_fires_on_the_nth_visit_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIVOPD_SIGINT_AT", "update:3")
    reset_fault_points()
    with StopRequest() as stop:
        fault_point("compose")
        fault_point("update")
        fault_point("update")
        assert not stop.requested
        fault_point("update")
        assert stop.requested
    reset_fault_points()


def _run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, phase: str | None) -> int:
    if phase is None:
        monkeypatch.delenv("DIVOPD_SIGINT_AT", raising=False)
    else:
        monkeypatch.setenv("DIVOPD_SIGINT_AT", phase)
    reset_fault_points()
    try:
        return cli.main(argv)
    finally:
        reset_fault_points()


# phase -> how many visits before the signal (each phase is reached at least this often in a 12-update run)
AT = {"load": "load", "start": "start", "compose": "compose:5", "update": "update:4", "publish": "publish:3",
      "eval": "eval:1", "checkpoint": "checkpoint:2"}


def test_every_phase_is_covered() -> None:
    assert set(AT) == set(PHASES)


#: ``load`` (a stop while the models load) is slow: the stop is seen at the same boundary as ``start``
@pytest.mark.parametrize("phase", [pytest.param(p, marks=pytest.mark.slow) if p == "load" else p for p in PHASES])
def test_sigint_in_any_phase_checkpoints_and_exits_130(phase: str, tiny_models: dict[str, str],  # noqa: F811
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_models, run_dir, "divopd-base", updates=UPDATES,
                      **{"eval.every": 3, "checkpoint.every": 2, "checkpoint.keep": 2})
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    rc = _run_cli(["train", str(cfg_path), "--no-progress"], monkeypatch, AT[phase])
    assert rc == EXIT_INTERRUPTED
    ckpts = sorted((run_dir / "checkpoints").glob("update-*"))
    assert ckpts, "a stop request must leave a checkpoint"
    version = int(ckpts[-1].name.split("-")[1])
    assert version < UPDATES
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["updates"] == version
    assert_ledger_identity(summary["ledger"])
    if phase in ("load", "start"):
        assert version == 0  # stopped before the first update
    if phase in ("load", "update"):  # the checkpoint resumes to the end
        assert _run_cli(["train", "--resume", str(run_dir), "--no-progress"], monkeypatch, None) == 0
        resumed = json.loads((run_dir / "summary.json").read_text())
        assert resumed["updates"] == UPDATES and not resumed["interrupted"]
        assert_ledger_identity(resumed["ledger"])
        updates = [m["update"] for m in read_metrics(run_dir) if m["kind"] == "update" and
                   "learner/loss" in m]
        assert updates == sorted(set(updates)) and updates[-1] == UPDATES  # every update recorded once


def test_ctrl_c_in_any_other_command_exits_130_without_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from divopd.analysis import simulate

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate, "run", interrupted)
    assert cli.main(["simulate", "--out", "x"]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err.strip() == "divopd simulate: interrupted" and "Traceback" not in err
