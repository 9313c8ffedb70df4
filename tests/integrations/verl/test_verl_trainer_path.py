"""The largest path verl 0.9.1's v1 trainer runs on a CPU with the plug-in.

verl's own config (``ppo_trainer.yaml`` composed by Hydra with the example's launch lines, the teacher on) → the
trainer's real ``PPOTrainer._build_replay_buffer`` (``custom_sampler.path`` resolved by verl's loader) → the blocking
``sample`` of the trainer's step, while a rollout-side thread puts one record per turn into the real TransferQueue →
the batch read back and cleared as the trainer does, and the step metrics through verl's ``MetricsAggregator``. The
next stage of ``_step_once`` (``_compute_old_log_prob``) needs verl's actor worker group (an FSDP/Megatron engine on
GPUs): not run here.
"""

from __future__ import annotations

import tempfile
import threading
import types
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import transfer_queue as tq  # noqa: E402
import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.trainer.ppo.v1.utils import MetricsAggregator  # noqa: E402
from verl_helpers import clear_partition, ledger_identity, put_turns, stream_log, ticks, trajectory_keys  # noqa: E402
from verl_launch import SCIENCEWORLD, read_script, with_values  # noqa: E402

from divopd.errors import UsageError  # noqa: E402
from divopd.integrations.verl import DivOPDReplayBuffer  # noqa: E402

#: The example's launch lines (examples/verl/run_divopd_scienceworld.sh, shown in docs/integrations/verl.md: the teacher
#: on, its resource pool, divopd's agent loop, manager and sampler), read from the script, with the fixture run's
#: B = 6, k = 2, δ = 1 (verl's threshold δ + 1 = 2).
OVERRIDES = with_values(read_script(SCIENCEWORLD)[0], {
    "data.train_batch_size": "6",
    "trainer.v1.sampler.max_off_policy_threshold": "2",
    "+trainer.v1.sampler.sampler_kwargs.cap": "2",
})


def _trainer_buffer(overrides: list[str]) -> tuple[DivOPDReplayBuffer, object]:
    # the example's experience log goes to a fresh folder of each test, not into the repository's runs/
    log_dir = tempfile.mkdtemp(prefix="divopd-verl-log-")
    overrides = with_values(overrides, {"+trainer.v1.sampler.sampler_kwargs.experience_dir": f"{log_dir}/experience"})
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    trainer = types.SimpleNamespace(config=config, trainer_mode=config.trainer.v1.trainer_mode,
                                    _add_prompts_to_generate=lambda n: None)
    return PPOTrainer._build_replay_buffer(trainer), config  # verl's own method on the config above


def test_verls_trainer_loads_the_plugin_and_samples_while_a_rollout_thread_writes(transfer_queue, tmp_path) -> None:
    rb, config = _trainer_buffer(OVERRIDES)
    assert config.distillation.enabled is True and config.distillation.n_gpus_per_node > 0  # the example's teacher
    assert isinstance(rb, DivOPDReplayBuffer) and rb.max_off_policy_threshold == 2
    rb.poll_interval = 0.05
    batch_size = config.data.train_batch_size // config.trainer.v1.get(config.trainer.v1.trainer_mode, {}).get(
        "parameter_sync_step", 1)
    log_ticks = ticks(stream_log(tmp_path))
    steps = 6
    released = [threading.Event() for _ in range(steps)]
    errors: list[BaseException] = []

    def rollout() -> None:  # the rollout side: tick j's turns once step j asks (version j - 1 ... like the log)
        try:
            for j in range(steps):
                released[j].wait(timeout=60)
                put_turns("train", log_ticks[j], prompt_uid=f"prompt{j}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    producer = threading.Thread(target=rollout, daemon=True)
    producer.start()
    seen: set[str] = set()
    unclear: list[str] = []  # handed out, not yet cleared: never handed out again
    aggregated = []
    try:
        for j in range(steps):
            released[j].set()
            batch, metrics = rb.sample(global_steps=j + 1, partition_id="train", batch_size=batch_size)
            assert len(batch.keys) == batch_size and not seen & set(batch.keys)
            seen |= set(batch.keys)
            data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["responses", "prompts"])
            assert data.batch_size[0] == batch_size
            unclear.extend(batch.keys)
            if j % 2 == 1:  # verl's step() clears its batches after parameter_sync_step (here 2) samples
                tq.kv_clear(keys=unclear, partition_id="train")
                unclear.clear()
            assert ledger_identity(rb.sampler.ledger)
            aggregator = MetricsAggregator()
            aggregator.add_step_metrics(metrics, sample_count=batch_size)
            aggregated.append(aggregator.get_aggregated_metrics())
        producer.join(timeout=60)
        assert not errors and not producer.is_alive()
        waiting = rb.get_sampleable_count(steps + 1, "train")  # reads what the rollout put after the last sample
        assert waiting == rb.sampler.waiting > 0 and trajectory_keys("train") == rb.waiting_keys()
    finally:
        clear_partition("train")
    assert all(m["ledger/selected"] == (i + 1) * batch_size for i, m in enumerate(aggregated))
    assert all(1 <= m["sampler/effective_rollouts"] <= batch_size for m in aggregated)


def test_a_starved_step_stops_with_one_line_at_its_deadline(transfer_queue) -> None:
    rb, _ = _trainer_buffer([*OVERRIDES, "+trainer.v1.sampler.sampler_kwargs.sample_timeout_s=0.3"])
    with pytest.raises(UsageError, match="no batch of 6 turns for step 1") as err:
        rb.sample(global_steps=1, partition_id="train", batch_size=6)
    assert "\n" not in str(err.value)


def test_validation_keeps_verls_own_rule(transfer_queue) -> None:
    import torch

    rb, _ = _trainer_buffer(OVERRIDES)
    try:
        tq.kv_put(key="v0_0_0", partition_id="val", fields={"responses": torch.tensor([1, 2])},
                  tag={"status": "success", "global_steps": 0})
        tq.kv_put(key="v0", partition_id="val", tag={"is_prompt": True, "status": "finished", "global_steps": 0})
        batch, _ = rb.sample(global_steps=1, partition_id="val", batch_size=1)
        assert batch.keys == ["v0_0_0"] and rb.sampler is None  # divopd's sampler was not involved
    finally:
        clear_partition("val")
