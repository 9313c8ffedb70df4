"""The loop watchdog and the per-stage time keys: a run that can only wait stops with one line, a checkpoint
and ``summary.json`` instead of waiting forever; a teacher that cannot score stops the run instead of making the
learner spin; every update record says where the time went.

The faults are injected with :class:`~test_loop.MemoryRuntime` variants (exact, no envs); the time keys come from a
real lockstep run on the tiny env."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from divopd.cli import main
from divopd.experience import Rollout
from divopd.train.assemble import RUNTIMES, RuntimeEntry, open_run
from divopd.train.config import dump_config
from divopd.train.loop import run_loop
from divopd.train.watchdog import EXIT_STALLED, Watchdog
from test_loop import B, MemoryRuntime
from test_train import assert_ledger_identity, read_metrics, tiny_config, tiny_models  # noqa: F401

pytestmark = pytest.mark.timeout(300)


class SilentRuntime(MemoryRuntime):
    """Explorers that are alive (``check_alive`` passes) but never hand over a rollout: hung in a call."""

    def poll(self, timeout: float) -> list[Rollout]:
        self.polls += 1
        return []


class TeacherlessRuntime(MemoryRuntime):
    """Explorers whose teacher cannot score: every turn arrives with ``teacher_logprobs`` ``None``."""

    def _rollout(self) -> Rollout:
        rollout = super()._rollout()
        for turn in rollout.turns:
            turn.teacher_logprobs = None
        return rollout


def _trainer(models: dict[str, str], run_dir: Path, **over: object) -> Any:
    cfg = tiny_config(models, run_dir, "divopd", updates=6,
                      **{"eval.every": 100, "checkpoint.every": 100, "runtime.stall_timeout_s": 1, **over})
    return open_run(cfg)[0]


def _vocab(trainer: Any) -> int:
    return trainer.learner.model.get_input_embeddings().num_embeddings


def test_a_run_whose_explorers_never_deliver_stops_with_a_checkpoint_and_a_reason(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    trainer = _trainer(tiny_models, tmp_path / "run")
    runtime = SilentRuntime(_vocab(trainer))
    summary = run_loop(trainer, runtime)  # returns (a run without the watchdog would poll forever)
    assert "waiting for rollouts" in summary["stalled"] and "runtime.stall_timeout_s" in summary["stalled"]
    assert "explorer" in summary["stalled"] and "\n" not in summary["stalled"]
    assert summary["updates"] == 0 and summary["interrupted"] is False
    assert runtime.eval_requests == [] and runtime.calls[-2:] == ["shutdown:True", "close:True"]
    assert (tmp_path / "run" / "checkpoints" / "update-000000").is_dir()
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["stalled"] == summary["stalled"]
    assert_ledger_identity(summary["ledger"])
    assert summary["ledger"]["received"] == runtime.produced  # the rollout handed over at shutdown is counted


def test_a_teacher_that_cannot_score_stops_the_run_instead_of_spinning(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    # a large stall timeout: rollouts keep arriving, so only the teacher rule can stop this run
    trainer = _trainer(tiny_models, tmp_path / "run", **{"runtime.stall_timeout_s": 3600})
    runtime = TeacherlessRuntime(_vocab(trainer))
    summary = run_loop(trainer, runtime)
    assert "teacher" in summary["stalled"] and "missing_teacher" in summary["stalled"]
    assert summary["updates"] == 0 and runtime.published == []
    ledger = summary["ledger"]
    assert ledger["received"] == runtime.produced and ledger["selected"] == 0
    assert_ledger_identity(ledger)
    # it stopped as soon as 4·B turns in a row arrived unscored: a couple of polls, not an endless loop
    assert runtime.produced >= 4 * B and runtime.polls <= 4 * B
    assert (tmp_path / "run" / "checkpoints" / "update-000000").is_dir()


def test_stall_timeout_zero_switches_the_teacher_rule_off(tiny_models: dict[str, str],  # noqa: F811
                                                          tmp_path: Path) -> None:
    trainer = _trainer(tiny_models, tmp_path / "run", **{"runtime.stall_timeout_s": 0, "max_seconds": 1})
    summary = run_loop(trainer, TeacherlessRuntime(_vocab(trainer)))
    assert "stalled" not in summary  # ran until max_seconds, as before


def test_the_teacher_streak_resets_on_a_scored_turn() -> None:
    runtime = MemoryRuntime(vocab=50)
    scored = [runtime._rollout() for _ in range(3)]
    unscored = [runtime._rollout() for _ in range(40)]
    for rollout in unscored:
        for turn in rollout.turns:
            turn.teacher_logprobs = None
    dog = Watchdog(60, batch_size=2)  # window: 8 turns
    dog.received(unscored[:2])
    dog.received(scored[:1])
    assert dog.teacher_failed() is None
    dog.received(unscored[2:])
    assert dog.teacher_failed() is not None


def test_divopd_train_prints_one_line_and_exits_3_when_the_run_stalls(
        tiny_models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=6,
                      **{"eval.every": 100, "runtime.stall_timeout_s": 1})
    config = tmp_path / "cfg.yaml"
    config.write_text(dump_config(cfg))
    monkeypatch.setitem(RUNTIMES, "threads", RuntimeEntry(lambda c, w, t: SilentRuntime(_vocab(t))))
    assert main(["train", str(config), "--no-progress"]) == EXIT_STALLED == 3
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("divopd train:")]
    assert len(err) == 1 and "stalled waiting for rollouts" in err[0] and "--resume" in err[0]
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["runtime"]["stall_timeout_s"] == 1
    assert (tmp_path / "run" / "checkpoints" / "update-000000").is_dir()


def test_every_update_record_of_a_real_run_carries_the_stage_times(tiny_models: dict[str, str],  # noqa: F811
                                                                   tmp_path: Path) -> None:
    from divopd.train import train

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=3,
                      **{"runtime.kind": "lockstep", "runtime.lockstep.env_steps_per_update": 6})
    summary = train(cfg)
    assert "stalled" not in summary
    updates = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "update"]
    assert len(updates) == 3
    for record in updates:
        for key in ("time/wait_s", "time/compose_s", "time/update_s", "time/publish_s", "time/generate_s",
                    "time/env_s", "time/score_s"):
            assert isinstance(record[key], float) and math.isfinite(record[key]) and record[key] >= 0, (key, record)
    assert all(r["time/update_s"] > 0 for r in updates)  # a learner step takes time
    # the explorers' generation and teacher scoring reach the learner's records through the rollouts
    assert sum(r["time/generate_s"] for r in updates) > 0 and sum(r["time/score_s"] for r in updates) > 0


def test_a_rollout_reports_its_explorers_stage_seconds_since_the_previous_one() -> None:
    handed: dict[str, float] = {}
    first, second = MemoryRuntime(vocab=50)._rollout().info, MemoryRuntime(vocab=50)._rollout().info
    first.set_stage_times({"time/generate": 2.0, "time/env": 1.0, "time/teacher_score": 0.5}, handed)
    second.set_stage_times({"time/generate": 3.5, "time/env": 1.0, "time/teacher_score": 0.75}, handed)
    assert (first.generate_s, first.env_s, first.score_s) == (2.0, 1.0, 0.5)
    assert (second.generate_s, second.env_s, second.score_s) == (1.5, 0.0, 0.25)


def test_a_run_whose_every_turn_the_gate_rejects_warns_then_stops_as_a_stall(
        tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """A gate that rejects every turn: every prompt longer than explorer.prompt.max_prompt_tokens (every turn
    prompt_truncated): one warning naming the reason and its key after runtime.rejected_turns_warning turns, then at
    4x a stall: one line, a checkpoint, exit 3 (it used to spin without a word).
    A real ``divopd train`` child process."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    cfg = tiny_config(tiny_models, run_dir, "divopd", updates=4, **{
        "explorer.prompt.max_prompt_tokens": 8, "runtime.rejected_turns_warning": 20, "eval.every": 100})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    proc = subprocess.run([sys.executable, "-m", "divopd", "train", str(path), "--no-progress"], capture_output=True,
                          text=True, timeout=600)
    err = proc.stderr
    assert proc.returncode == EXIT_STALLED and "Traceback" not in err, err[-3000:]
    warnings = [line for line in err.splitlines() if "rejected by the gate since update 0 and no update" in line
                and "WARNING" in line]
    assert len(warnings) == 1, err[-3000:]
    assert "top reason prompt_truncated" in warnings[0]
    assert "governed by explorer.prompt.max_prompt_tokens" in warnings[0]
    last = err.strip().splitlines()[-1]
    assert last.startswith("divopd train: error: stalled at the gate:") and "checkpointed at update 0" in last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stalled"].startswith("stalled at the gate") and summary["updates"] == 0
    ledger = summary["ledger"]
    assert_ledger_identity(ledger)
    assert ledger["invalid_by_reason"]["prompt_truncated"] >= 80 and ledger["selected"] == 0
    assert (run_dir / "checkpoints" / "update-000000" / "state.json").is_file()
