"""The strategy's experience log (``sample_strategy_args.experience_dir``) and its dispatch metrics: the log a Trinity
run writes is divopd's (``divopd replay DIR`` and ``divopd tune-cap DIR`` read it), replaying it with the same rule
and settings gives, update by update, the statistics the strategy reported, and each step reports the arrival ratio,
the sessions, the turns per session and the expired share."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trinity")

from opd_stream import SETTINGS, UPDATES, reference, rollout_ranks, to_experience  # noqa: E402
from queue_helpers import buffer_config, queue_writer, strategy  # noqa: E402

from divopd.analysis.replay import ReplayConfig, replay  # noqa: E402
from divopd.errors import UsageError  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.sampling import SamplerConfig  # noqa: E402

DISPATCH_KEYS = ("sampler/arrival_ratio", "sampler/sessions_started", "sampler/turns_per_session",
                 "sampler/expired_share")


async def _run(log: Path, tmp_path: Path, method: str, out: Path) -> list[dict]:
    """The strategy over the stream of ``log``, delivered tick by tick, writing its own log into ``out``."""
    ticks, _ = reference(log, SamplerConfig(method, seed=0, **SETTINGS), UPDATES)
    ranks = rollout_ranks(log)
    buffer = buffer_config(tmp_path, SETTINGS["batch_size"])
    steps = []
    async with queue_writer(buffer) as writer:
        plugin = strategy(buffer, method=method, experience_dir=str(out), **SETTINGS)
        for tick in ticks:
            if tick.delivered:
                await writer.write([to_experience(t, ranks[t.rollout_id]) for t in tick.delivered])
            _, metrics, _ = await plugin.sample(tick.update + 1)
            steps.append(metrics)
        plugin.state_dict()  # a checkpoint compacts the log's parts
    return steps


@pytest.mark.parametrize("method", ["divopd", "vanilla"])
def test_replaying_the_strategys_log_gives_the_statistics_it_reported(ray_local, divopd_log: Path, tmp_path: Path,
                                                                      method: str) -> None:
    out = tmp_path / "experience"
    steps = asyncio.run(_run(divopd_log, tmp_path, method, out))
    replayed = replay(out, ReplayConfig(methods=(method,), updates=UPDATES, seed=0, **SETTINGS))
    series = replayed["methods"][method]["series"]
    assert series["batch"] == [1] * UPDATES
    for j, metrics in enumerate(steps):
        assert metrics["sampler/effective_rollouts"] == pytest.approx(series["effective_rollouts"][j]), j
        assert (metrics["ledger/selected"], metrics["ledger/invalid"], metrics["ledger/expired"]) == (
            series["selected"][j], series["invalid"][j], series["expired"][j]), j
    logged = list(read_log(out))
    assert len(logged) == int(steps[-1]["ledger/received"])  # every turn the strategy received, once
    assert len(list(out.glob("part-*.parquet"))) == 1  # compacted at the checkpoint
    for verb in ("replay", "tune-cap"):  # the user's commands on the run's log
        done = subprocess.run([sys.executable, "-m", "divopd", verb, str(out), "--batch-size",
                               str(SETTINGS["batch_size"])], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (verb, done.stderr)


def test_each_step_reports_the_arrival_ratio_and_warns_when_out_of_band(ray_local, divopd_log: Path, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="divopd.integrations"):
        steps = asyncio.run(_run(divopd_log, tmp_path, "divopd", tmp_path / "experience"))
    for metrics in steps:
        assert all(key in metrics for key in DISPATCH_KEYS)
        assert 0 <= metrics["sampler/expired_share"] <= 1
    arrived = sum(m["sampler/arrival_ratio"] for m in steps) * SETTINGS["batch_size"]
    delivered = sum(len(t.delivered) for t in reference(divopd_log, SamplerConfig("divopd", seed=0, **SETTINGS),
                                                          UPDATES)[0])
    # what the strategy read, plus what it counted in Trinity's queue unread, up to all that was written
    assert steps[-1]["ledger/received"] <= round(arrived) <= delivered
    assert steps[-1]["sampler/turns_per_session"] > 1
    mean = sum(m["sampler/arrival_ratio"] for m in steps[1:4]) / 3
    band = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
    assert bool(band) == (not 1.0 <= mean <= 4.0), (mean, band)
    assert all("buffer.batch_size" in line and "\n" not in line for line in band)


def test_a_bad_dispatch_setting_is_one_line(ray_local, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="target_arrival_ratio"):
        strategy(buffer_config(tmp_path, 8), target_arrival_ratio=0.5)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match="experience_dir"):
        strategy(buffer_config(tmp_path, 8), experience_dir=str(tmp_path / "a-file"))
