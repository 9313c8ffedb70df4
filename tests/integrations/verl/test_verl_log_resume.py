"""The DivOPD buffer's ``experience_dir`` across verl runs: the buffer is built by verl's own
``PPOTrainer._build_replay_buffer`` on verl's composed config (the example's launch lines) and reads from it, as verl's
``_load_checkpoint`` decides, whether this run resumes (``trainer.resume_mode``, ``trainer.default_local_dir``, verl's
``find_latest_ckpt_path``) and from which step.

A fresh run (no checkpoint, or ``resume_mode=disable``) refuses a directory that holds a log, in one line, and changes
nothing there; a run resumed from ``global_step_K`` continues its log without the rows logged at learner version K or
later, its new rows numbered after the log's. verl's checkpoint itself (``global_step_K/`` and
``latest_checkpointed_iteration.txt``, what ``_save_checkpoint`` writes after the actor's weights) is written here by
hand: the actor worker group that saves the weights needs GPUs.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import transfer_queue as tq  # noqa: E402
import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl_helpers import (  # noqa: E402
    clear_partition,
    new_partition,
    put_turns,
    replay_config,
    stream_log,
    ticks,
)
from verl_launch import SCIENCEWORLD, read_script, with_values  # noqa: E402

from divopd.analysis.replay import replay  # noqa: E402
from divopd.errors import UsageError  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.integrations.verl import DivOPDReplayBuffer  # noqa: E402

B = 6
#: The example's launch lines with the fixture run's B = 6, k = 2, δ = 1 (verl's threshold δ + 1 = 2).
OVERRIDES = with_values(read_script(SCIENCEWORLD)[0], {
    "data.train_batch_size": str(B),
    "trainer.v1.sampler.max_off_policy_threshold": "2",
    "+trainer.v1.sampler.sampler_kwargs.cap": "2",
})


def _buffer(log_dir: Path, checkpoints: Path, **values: str) -> DivOPDReplayBuffer:
    """The buffer verl's trainer builds for the example's launch lines with this experience_dir and checkpoint folder
    (``values``: further ``trainer.*`` overrides, e.g. ``resume_mode``)."""
    overrides = with_values(OVERRIDES, {"+trainer.v1.sampler.sampler_kwargs.experience_dir": str(log_dir),
                                        "trainer.default_local_dir": str(checkpoints),
                                        **{f"trainer.{k}": v for k, v in values.items()}})
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    trainer = types.SimpleNamespace(config=config, trainer_mode=config.trainer.v1.trainer_mode,
                                    _add_prompts_to_generate=lambda n: None)
    rb = PPOTrainer._build_replay_buffer(trainer)
    rb.poll_interval = 0.01
    return rb


def _save_checkpoint(checkpoints: Path, step: int) -> None:
    """What verl's ``_save_checkpoint`` leaves for ``find_latest_ckpt_path``: the step's folder and the tracker."""
    (checkpoints / f"global_step_{step}").mkdir(parents=True, exist_ok=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))


def _steps(rb: DivOPDReplayBuffer, stream: list, first_step: int) -> list[dict]:
    """verl's synchronous steps ``first_step``, ... over ``stream`` (the turns each step's rollouts bring)."""
    partition, out = new_partition(), []
    try:
        for i, turns in enumerate(stream):
            put_turns(partition, turns, prompt_uid=f"p{first_step + i}")
            batch, metrics = rb.sample_nowait(global_steps=first_step + i, partition_id=partition, batch_size=B)
            if batch is not None:
                tq.kv_clear(keys=batch.keys, partition_id=partition)
            out.append(metrics)
    finally:
        clear_partition(partition)
    return out


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_resumed_verl_run_continues_its_log_cut_back_to_the_checkpoint(transfer_queue, tmp_path: Path) -> None:
    stream = ticks(stream_log(tmp_path))
    out, checkpoints, ckpt = tmp_path / "runs" / "sw" / "experience", tmp_path / "checkpoints", 4
    first = _steps(_buffer(out, checkpoints), stream[:ckpt + 2], 1)  # steps 1..6; checkpoint after step 4
    _save_checkpoint(checkpoints, ckpt)
    logged_first = list(read_log(out))
    rb = _buffer(out, checkpoints)  # resume_mode auto: verl resumes from global_step_4, its first step is 5
    _steps(rb, stream[ckpt:], ckpt + 1)
    logged = list(read_log(out))
    kept = [x for x in logged_first if x.arrival_update < ckpt]
    assert len(kept) < len(logged_first)  # turns were logged past the checkpoint, and they went
    assert [(x.turn.key, x.arrival) for x in logged[:len(kept)]] == [(x.turn.key, x.arrival) for x in kept]
    assert [x.arrival for x in logged] == list(range(len(logged)))  # the fresh sampler's numbers follow the log's
    assert len(logged) == len(kept) + rb.sampler.ledger.received
    assert min(x.arrival_update for x in logged[len(kept):]) == ckpt
    series = replay(out, replay_config("divopd"))["methods"]["divopd"]["series"]  # replay reads the whole log
    for j, metrics in enumerate(first[:ckpt]):  # and gives, up to the checkpoint, what the first session reported
        assert (metrics["ledger/selected"], metrics["ledger/expired"]) == (series["selected"][j],
                                                                           series["expired"][j]), j


@pytest.mark.parametrize("how", ["no checkpoint", "resume_mode=disable", "another run's checkpoint"])
def test_a_fresh_verl_run_refuses_a_log_in_one_line_and_changes_nothing(transfer_queue, tmp_path: Path,
                                                                        how: str) -> None:
    out, checkpoints = tmp_path / "experience", tmp_path / "checkpoints"
    _steps(_buffer(out, checkpoints), ticks(stream_log(tmp_path))[:3], 1)
    before = _files(out)
    values = {}
    if how == "resume_mode=disable":
        _save_checkpoint(checkpoints, 2)
        values = {"resume_mode": "disable"}
    elif how == "another run's checkpoint":
        _save_checkpoint(tmp_path / "other", 2)
        values = {"resume_mode": "resume_path", "resume_from_path": str(tmp_path / "other" / "global_step_2")}
    with pytest.raises(UsageError) as err:
        _buffer(out, checkpoints, **values)
    line = str(err.value)
    assert line.startswith("trainer.v1.sampler.sampler_kwargs.experience_dir") and "\n" not in line
    assert str(out) in line and "give this run a new experience_dir, or remove" in line
    assert _files(out) == before
