#!/usr/bin/env bash
# verl 0.9.1 on-policy distillation on ScienceWorld, the packaged `scienceworld` setting, batches composed by DivOPD.
# The setting of src/divopd/configs/scienceworld.yaml: student Qwen/Qwen2.5-1.5B-Instruct, teacher
# fnlp/Embodied_R1-ScienceWorld (hf download fnlp/Embodied_R1-ScienceWorld), B = 64 turns per update, c = 4, k = 4,
# delta = 2 (max_off_policy_threshold=3), W = 8; validation = the first 256 held-out tasks (the paper's evaluation).
# Run from the repository root:  bash examples/verl/run_divopd_scienceworld.sh [more key=value overrides]
# Installs and what ran where: docs/integrations/verl.md (this script's launch line never ran on GPUs here; its data
# lines run on a CPU in the tests).
# Hardware: one node, 8 GPUs: 4 for the actor + rollout (FSDP + vLLM), 4 for the teacher (2 replicas, TP 2).
# divopd's agent loop divopd_env_agent plays each session turn by turn, its manager has verl's teacher score every
# turn, verl's distillation loss (k3) trains. Dispatch: the DivOPD buffer starts the sessions itself so that about
# target_arrival_ratio x B turns arrive per update (docs/integrations/verl.md, "Dispatch").
set -euo pipefail

DATA=data/scienceworld
# The data files (divopd never overwrites a file: made once, reused by later runs; the folder is created).
[ -f "$DATA/train.parquet" ] || divopd tasks scienceworld --for verl --split train --out "$DATA/train.parquet"
[ -f "$DATA/val.parquet" ] || divopd tasks scienceworld --for verl --split test --limit 256 --out "$DATA/val.parquet"

MANAGER=divopd.integrations.verl_agent_loop.DivOPDAgentLoopManagerTQ
python -m verl.trainer.main_ppo \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/val.parquet" \
  data.train_batch_size=64 \
  data.max_prompt_length=4096 \
  data.max_response_length=512 \
  actor_rollout_ref.rollout.n=1 \
  actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.agent.default_agent_loop=divopd_env_agent \
  +actor_rollout_ref.rollout.agent.agent_loop_manager_class="$MANAGER" \
  distillation.enabled=true \
  distillation.distillation_loss.loss_mode=k3 \
  distillation.teacher_models.teacher_model.model_path=fnlp/Embodied_R1-ScienceWorld \
  distillation.nnodes=1 \
  distillation.n_gpus_per_node=4 \
  trainer.v1.sampler.custom_sampler.path=pkg://divopd.integrations.verl \
  trainer.v1.sampler.custom_sampler.name=DivOPDReplayBuffer \
  trainer.v1.sampler.max_off_policy_threshold=3 \
  +trainer.v1.sampler.sampler_kwargs.method=divopd \
  +trainer.v1.sampler.sampler_kwargs.target_arrival_ratio=2.0 \
  +trainer.v1.sampler.sampler_kwargs.experience_dir=runs/scienceworld-divopd/experience \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node=4 \
  trainer.project_name=divopd \
  trainer.experiment_name=scienceworld-divopd \
  "$@"
