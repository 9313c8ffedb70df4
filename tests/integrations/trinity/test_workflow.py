"""divopd's per-turn OPD workflow inside Trinity-RFT's real ``WorkflowRunner``: real divopd envs (``tiny``, and the
JVM envs TextWorld-Express and ScienceWorld, tests/integrations/real_envs.py; no JVM outlives a test), task
rows written by ``divopd tasks --for trinity`` and read by Trinity's own task reader, the rollout model and the
teacher behind Trinity's real ``ModelWrapper`` (an HF transformers model behind Trinity's engine interface: its vLLM
engines need a GPU), experiences into Trinity's real queue, batches from DivOPDSampleStrategy, then Trinity's real
``to_data_proto`` and its stock ``on_policy_distill`` advantage: finite, unscored positions masked."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("trinity.common.workflows")
#: Trinity's ModelWrapper imports vLLM at import time; without vLLM (this CPU venv) import-only placeholders
from divopd.integrations.trinity_try import engines, play_tasks, trinity_config  # noqa: E402  (before Trinity's model module)

# isort: split
import ray  # noqa: E402
import torch  # noqa: E402
from datasets import load_dataset  # noqa: E402
from queue_helpers import assert_ledger_identity, buffer_config, queue_writer, strategy  # noqa: E402
from real_envs import ENVS, env_setting  # noqa: E402
from trinity.algorithm.advantage_fn.on_policy_distill_advantage import OnPolicyDistillAdvantage  # noqa: E402
from trinity.common.config import Config  # noqa: E402
from trinity.common.experience import Experience  # noqa: E402
from trinity.common.workflows import WORKFLOWS, Task  # noqa: E402
from trinity.explorer.workflow_runner import WorkflowRunner  # noqa: E402
from trinity.trainer.verl.utils import to_data_proto  # noqa: E402

import divopd.integrations.trinity_workflow  # noqa: E402,F401  (registers the divopd_* workflows)
from divopd.commands.tasks import task_rows  # noqa: E402
from divopd.integrations.trinity_tasks import write_tasks  # noqa: E402
from divopd.train.config import load_config  # noqa: E402
from tiny_models import build_tiny_models  # noqa: E402

RUNS = 2  # repeat_times: runs per task (eid.run)


def _config(models: dict[str, str]) -> Config:
    return trinity_config(models)


def _engines(config: Config, models: dict[str, str]) -> list:
    """The named actors Trinity's Allocator looks up (divopd.integrations.trinity_try's HF engines)."""
    return engines(config, models, os.pathsep.join([*sys.path[1:], os.environ.get("PYTHONPATH", "")]))


#: env (tests/integrations/real_envs.py) -> (Trinity workflow, tasks, overrides). ``scienceworld`` runs through its
#: named entry, whose defaults are the packaged ``scienceworld`` setting's explorer section.
WORKFLOWS_PLAYED: dict[str, tuple[str, int, list[str]]] = {
    "tiny": ("divopd_opd_workflow", 4, ["explorer.max_steps=4", "explorer.generation.max_new_tokens=4"]),
    "twx": ("divopd_opd_workflow", 4, ["explorer.max_steps=4"]),
    "scienceworld": ("divopd_scienceworld_workflow", 2,
                     ["explorer.max_steps=4", "explorer.generation.max_new_tokens=6"]),
}


@pytest.mark.parametrize("env", ENVS)
def test_trinity_runs_the_divopd_workflow_and_its_batches_train_finite(ray_local, jvms_closed, tmp_path: Path,
                                                                       env: str) -> None:
    """Several tasks, a few turns each, on ``tiny`` and on the real JVM envs TextWorld-Express and ScienceWorld."""
    workflow, limit, overrides = WORKFLOWS_PLAYED[env]
    cfg, models = env_setting(env, tmp_path / "models", overrides)
    assert cfg.explorer.env == env
    folder = tmp_path / "tasks"
    folder.mkdir()
    write_tasks(task_rows(cfg, "train", limit=limit), folder / "train.jsonl")
    # what Trinity's TaskFileReader does (load_dataset(path, split=...) + TaskFormatter); its module needs
    # sqlalchemy's asyncio extra (greenlet), which this venv lacks
    rows = load_dataset(str(folder), split="train")
    tasks = [Task(workflow=WORKFLOWS.get(workflow), raw_task=row) for row in rows]
    config = _config(models)
    engines = _engines(config, models)
    try:
        experiences = asyncio.run(_play(config, engines, tasks, RUNS))
    finally:
        for actor in engines:
            ray.kill(actor)
    assert len({e.eid.rid for e in experiences}) == limit * RUNS
    by_rollout: dict[str, list[Experience]] = {}
    for e in experiences:
        by_rollout.setdefault(e.eid.rid, []).append(e)
    for exps in by_rollout.values():  # the env's own episode: one experience per env step, its outcome on each
        assert sorted(e.eid.step for e in exps) == list(range(exps[0].info["horizon"]))
        assert {e.info["env"] for e in exps} == {env} and len({e.info["success"] for e in exps}) == 1
    assert sum(len(exps) for exps in by_rollout.values()) > len(by_rollout)  # multi-turn
    asyncio.run(_train(experiences, tmp_path))


async def _play(config: Config, engines: list, tasks: list, runs: int) -> list[Experience]:
    runner = WorkflowRunner(config, rollout_model_id=0, auxiliary_model_ids=[0], runner_id=0)
    experiences: list[Experience] = []
    for i, task in enumerate(tasks):
        task.batch_id, task.task_id = "b0", i
        await engines[0].sync_model_weights.remote(i // 2)  # the weight sync between tasks: versions 0, 0, 1, 1
        status, payload = await runner.run_task(task, batch_id="b0", repeat_times=runs)
        assert status.ok, status.message
        experiences += Experience.deserialize_many(payload)
    return experiences


async def _train(experiences: list[Experience], tmp_path: Path) -> None:
    """Trinity's queue, the divopd strategy's batch, Trinity's ``to_data_proto`` and its OPD advantage: finite."""
    keys = {(e.eid.rid, e.eid.step) for e in experiences}
    assert len(keys) == len(experiences)
    for e in experiences:
        n = len(e.tokens) - e.prompt_length
        assert len(e.logprobs) == len(e.teacher_logprobs) == len(e.action_mask) == n
        assert torch.isfinite(e.teacher_logprobs).all() and e.info["divopd_policy_version"] in (0, 1)
    # the teacher could not score the first position of every turn (as a NaN from another workflow would arrive)
    for e in experiences:
        e.teacher_logprobs[0] = float("nan")
    batch_size = 8
    buffer = buffer_config(tmp_path, batch_size)
    async with queue_writer(buffer) as writer:
        await writer.write(experiences)
        plugin = strategy(buffer, method="divopd", pool_factor=2, cap=2, max_staleness=2)
        batch, metrics, _ = await plugin.sample(2)
        assert len(batch) == batch_size
        assert metrics["sampler/teacher_masked_tokens"] == sum(1 for e in batch if not e.truncate_status) > 0
        assert_ledger_identity(plugin.sampler.ledger)
        for e in batch:  # Trinity's runner wrote the task's start version: the turn's own is back
            assert e.info["model_version"] == e.info["divopd_policy_version"]
        proto = to_data_proto(batch, pad_token_id=0, model=None, logger=None)
        proto.batch["old_log_probs"] = proto.batch["rollout_log_probs"]  # the trainer's recompute, same weights
        proto, adv_metrics = OnPolicyDistillAdvantage()(proto)
        assert torch.isfinite(proto.batch["advantages"]).all(), "a NaN reached Trinity's advantage"
        assert all(torch.isfinite(torch.tensor(v)) for v in adv_metrics.values())
        masked = ~proto.batch["response_mask"].bool()
        assert (proto.batch["advantages"][masked] == 0).all()


def test_the_finite_hand_over_masks_unscored_positions() -> None:
    """A NaN teacher position leaves the action mask and carries the student's log prob (what the strategy does)."""
    from trinity.common.experience import EID

    from divopd.integrations.trinity_records import mask_unscored

    exp = Experience(eid=EID(batch=0, task=1, run=0, step=0), tokens=torch.arange(7), prompt_length=3,
                     logprobs=torch.tensor([-1.0, -2.0, -3.0, -4.0]),
                     teacher_logprobs=torch.tensor([-1.5, float("nan"), float("-inf"), -0.5]),
                     action_mask=torch.tensor([True, True, False, True]), reward=0.0, info={"model_version": 0})
    assert mask_unscored(exp) == 1  # one *action* position was unscored; the -inf one was not an action anyway
    assert exp.action_mask.tolist() == [True, False, False, True]
    assert exp.teacher_logprobs.tolist() == [-1.5, -2.0, -3.0, -0.5]
    assert sys.modules["divopd.integrations.trinity_records"].mask_unscored(exp) == 0


def test_under_plus_r_the_teacher_generates_the_takeover_turns_through_its_trinity_engine(ray_local,
                                                                                          tmp_path: Path) -> None:
    """+R in Trinity: after p = 1 no-progress student turn the teacher's own engine (``auxiliary_model_wrappers[0]``,
    ``generate_async``) plays the takeover turn (m = 1 per rollout); takeover turns are played but not emitted."""
    models = build_tiny_models(tmp_path / "models")
    cfg = load_config("tiny", ["explorer.env=tiny", "explorer.env_kwargs={}", "explorer.max_steps=6",
                               "explorer.generation.max_new_tokens=4"])
    folder = tmp_path / "tasks"
    folder.mkdir()
    write_tasks(task_rows(cfg, "train", limit=3), folder / "train.jsonl")
    recovery = {"enabled": True, "patience": 1, "max_takeover": 1, "warmup": 0}
    tasks = [Task(workflow=WORKFLOWS.get("divopd_opd_workflow"), raw_task=row,
                  workflow_args={"explorer": {"recovery": recovery}})
             for row in load_dataset(str(folder), split="train")]
    config = _config(models)
    engines = _engines(config, models)
    try:
        experiences = asyncio.run(play_tasks(config, tasks, batch_id="b0"))
        teacher_calls = ray.get(engines[1].__ray_call__.remote(lambda engine: engine.calls))
    finally:
        for actor in engines:
            ray.kill(actor)
    by_rollout: dict[str, list[Experience]] = {}
    for e in experiences:
        by_rollout.setdefault(e.eid.rid, []).append(e)
    took_over = [exps for exps in by_rollout.values() if exps[0].info["teacher_turns"] > 0]
    assert took_over, "no rollout reached the +R trigger"
    assert teacher_calls == sum(exps[0].info["teacher_turns"] for exps in by_rollout.values())
    for exps in by_rollout.values():  # every env step was a student turn (emitted) or a teacher turn (not emitted)
        info = exps[0].info
        assert info["teacher_turns"] <= 1 and len(exps) + info["teacher_turns"] == info["horizon"]
    for exps in took_over:  # the teacher's step is missing from the emitted turn indices (eid.step = env step)
        assert {e.eid.step for e in exps} < set(range(exps[0].info["horizon"]))
