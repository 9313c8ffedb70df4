"""divopd's multi-turn agent loop (``divopd_env_agent``) inside verl 0.9.1's real agent-loop classes, on a CPU.

What is real: verl's config (``ppo_trainer.yaml`` composed by Hydra, distillation on), verl's TQ worker
(``AgentLoopWorkerTQ``: its ``__init__``, ``_run_prompt``, ``_run_agent_loop`` with the agent-loop registry and Hydra
instantiation, ``_agent_loop_postprocess`` writing TransferQueue records) under the plug-in's worker override, verl's
``LLMServerClient.generate`` (it stamps each call's weights version) and verl's teacher path
(``AsyncTeacherLLMServerManager.compute_teacher_logprobs_single``), divopd environments (``tiny``, and the JVM envs
TextWorld-Express and ScienceWorld: tests/integrations/real_envs.py; no JVM outlives a test), real HF transformers
models (tests/tiny_models.py; for TextWorld-Express the ones divopd ships for coin6-dart), the real TransferQueue, the
plug-in's replay buffer and verl's own per-token distillation estimator (``core_algos.kl_penalty``, k3) and loss
aggregation (``agg_loss``) on what it hands over.

What stands in: the vLLM servers behind verl's server clients (vLLM's GPU engine does not run here): an in-process
"server" whose ``generate`` runs the HF model, returning what verl's vLLM server returns (sampled tokens and their
log probs with ``global_steps``; for the teacher, ``prompt_ids`` / ``prompt_logprobs`` rows where row ``i`` scores
token ``i + 1`` and the last row is a dummy), and the load balancer that picks a server.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transfer_queue as tq  # noqa: E402
import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from real_envs import ENVS, env_setting  # noqa: E402
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty  # noqa: E402
from verl_helpers import clear_partition, ledger_identity, make_buffer  # noqa: E402

from divopd.commands.tasks import task_rows  # noqa: E402
from divopd.integrations.verl_agent_loop import _DivOPDWorker  # noqa: E402
from divopd.integrations.verl_env_agent import AGENT_NAME  # noqa: E402
from divopd.integrations.verl_records import SUMMARY_TAG, parse_key  # noqa: E402
from divopd.integrations.verl_try import HFServer, server_client  # noqa: E402


class _HFServer(HFServer):
    """divopd's stand-in for verl's vLLM server, its weights synced every 5 calls, so long episodes span versions."""

    def weights_version(self) -> int:
        return 3 + self.calls // 5


def _config(models: dict[str, str]) -> Any:
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={models['student']}",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.rollout.prompt_length=512", "actor_rollout_ref.rollout.response_length=6",
            "actor_rollout_ref.rollout.n=2",
            "distillation.enabled=true", "distillation.distillation_loss.loss_mode=k3",
            f"distillation.teacher_models.teacher_model.model_path={models['teacher']}",
        ])


#: env (tests/integrations/real_envs.py) -> tasks played (2 sessions each: rollout.n = 2)
TASKS = {"tiny": 3, "twx": 3, "scienceworld": 2}


@pytest.mark.parametrize("env", ENVS)
def test_verls_worker_plays_a_divopd_env_and_writes_one_teacher_scored_record_per_turn(transfer_queue, jvms_closed,
                                                                                       tmp_path, env: str) -> None:
    """Several tasks, a few turns each, on ``tiny`` and on the real JVM envs TextWorld-Express and ScienceWorld."""
    torch.set_num_threads(1)
    limit = TASKS[env]
    cfg, models = env_setting(env, tmp_path / "models", ["explorer.max_steps=4"])
    assert cfg.explorer.env == env
    config = _config(models)
    student, teacher = _HFServer(models["student"]), _HFServer(models["teacher"], unscored_every=1)
    # verl keys one teacher "default"
    worker = _DivOPDWorker(config, llm_client=server_client(config, student),
                           teacher_client={"default": server_client(config, teacher)})
    rows = task_rows(cfg, "train", limit=limit)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    clear_partition("train")

    async def play() -> None:
        for i, row in enumerate(rows):
            prompt = {"uid": f"task{i}", "agent_name": AGENT_NAME, "raw_prompt": [{"role": "user", "content": "-"}],
                      "extra_info": {"index": i, "divopd_task": json.dumps(row)}, "index": i, "global_steps": 4}
            trajectory = {"step": 4, "sample_index": i, "rollout_n": 0, "validate": False}
            await worker._run_prompt(prompt, dict(sampling), trajectory)

    try:
        asyncio.run(play())
        listing = tq.kv_list(partition_id="train")["train"]
        assert {listing[f"task{i}"]["status"] for i in range(limit)} == {"finished"}, listing  # no session failed
        records = {k: t for k, t in listing.items() if k.count("_") == 2}
        by_rollout: dict[str, list[int]] = {}
        for key in records:
            rid, turn = parse_key(key)
            by_rollout.setdefault(rid, []).append(turn)
        assert sorted(by_rollout) == [f"task{i}_{s}" for i in range(limit) for s in range(2)]
        assert all(sorted(t) == list(range(len(t))) for t in by_rollout.values())
        assert sum(len(t) for t in by_rollout.values()) > 2 * limit  # multi-turn: more records than sessions
        assert teacher.calls == len(records)  # verl's teacher path scored every turn, not only the last
        for tag in records.values():
            assert tag["status"] == "success" and SUMMARY_TAG in tag and "prompt_truncated" in tag
        versions = {rid: [records[f"{rid}_{t}"]["min_global_steps"] for t in sorted(turns)]
                    for rid, turns in by_rollout.items()}
        assert all(v == sorted(v) for v in versions.values())
        assert any(len(set(v)) > 1 for v in versions.values()), versions  # each turn carries its own version
        keys = sorted(records)
        data = tq.kv_batch_get(keys=keys, partition_id="train",
                               select_fields=["prompts", "responses", "teacher_logprobs", "teacher_ids"])
        for i in range(len(keys)):
            p, n = len(data["prompts"][i]), len(data["responses"][i])
            assert tuple(data["teacher_logprobs"][i].shape) == (p + n, 1)  # verl's [P + R, K] layout
        unscored = sum(records[k][SUMMARY_TAG]["unscored"] for k in keys)
        assert unscored > 0

        # the plug-in composes from these records; what it hands over is what verl's loss reads
        rb = make_buffer("divopd", max_pending_age=None)
        batch_size = 6
        batch, metrics = rb.sample_nowait(global_steps=5, partition_id="train", batch_size=batch_size)
        assert batch is not None and len(batch.keys) == batch_size and ledger_identity(rb.sampler.ledger)
        assert rb.sampler.ledger.received == len(records)
        picked = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=[
            "prompts", "responses", "response_mask", "rollout_log_probs", "teacher_logprobs"])
        masked = sum(records[k][SUMMARY_TAG]["unscored"] for k in batch.keys)
        assert metrics["sampler/teacher_masked_tokens"] == masked == batch_size  # one per turn (the last token)
        losses, masks = [], []
        for i in range(batch_size):
            p, n = len(picked["prompts"][i]), len(picked["responses"][i])
            teacher_rows = picked["teacher_logprobs"][i][p - 1:p - 1 + n, 0]
            student_rows = picked["rollout_log_probs"][i]
            assert torch.isfinite(teacher_rows).all()
            losses.append(kl_penalty(student_rows[None], teacher_rows[None], "k3")[0])
            masks.append(picked["response_mask"][i])
        width = max(len(x) for x in losses)
        loss_mat = torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in losses])
        mask = torch.stack([torch.nn.functional.pad(m, (0, width - len(m))) for m in masks]).float()
        assert int(sum(len(m) for m in masks) - mask.sum()) == masked  # unscored positions left the mask
        loss = agg_loss(loss_mat, mask, "token-mean", batch_num_tokens=int(mask.sum()), global_batch_size=batch_size)
        assert torch.isfinite(loss) and np.isfinite(float(loss))
    finally:
        clear_partition("train")
