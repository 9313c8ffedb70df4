#!/usr/bin/env bash
# verl 0.9.1 on-policy distillation on ScienceWorld, batches composed by DivOPD (docs/integrations/verl.md).
# Run from the repository root:  bash examples/verl/run_divopd_scienceworld.sh [more key=value overrides]
# Installs: verl[verl-core]==0.9.1 with vLLM, then divopd (pip install --no-deps -e .), as the page says.
# Hardware: one node, 8 GPUs: 4 for the actor + rollout (FSDP + vLLM), 4 for the teacher (2 replicas, TP 2).
# Student Qwen/Qwen3-1.7B, teacher Qwen/Qwen3-8B; divopd's agent loop divopd_env_agent plays each session turn by
# turn and its manager has verl's teacher score every turn; verl's distillation loss (k3) trains.
# Dispatch: B = data.train_batch_size = 256 turns per update; with rollout.n=1 each step starts 256 sessions, the
# pool the paper asks for (>= 4 * ceil(B / k) = 256 rollouts, k = cap = 4); surplus turns wait or expire, counted.
set -euo pipefail

DATA=data/scienceworld
# The data files (divopd never overwrites a file: made once, reused by later runs).
[ -f "$DATA/train.parquet" ] || divopd tasks scienceworld --for verl --split train --out "$DATA/train.parquet"
[ -f "$DATA/val.parquet" ] || divopd tasks scienceworld --for verl --split dev --out "$DATA/val.parquet"

MANAGER=divopd.integrations.verl_agent_loop.DivOPDAgentLoopManagerTQ
python -m verl.trainer.main_ppo \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/val.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=4096 \
  data.max_response_length=512 \
  actor_rollout_ref.rollout.n=1 \
  actor_rollout_ref.model.path=Qwen/Qwen3-1.7B \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.agent.default_agent_loop=divopd_env_agent \
  +actor_rollout_ref.rollout.agent.agent_loop_manager_class="$MANAGER" \
  distillation.enabled=true \
  distillation.distillation_loss.loss_mode=k3 \
  distillation.teacher_models.teacher_model.model_path=Qwen/Qwen3-8B \
  distillation.nnodes=1 \
  distillation.n_gpus_per_node=4 \
  trainer.v1.sampler.custom_sampler.path=pkg://divopd.integrations.verl \
  trainer.v1.sampler.custom_sampler.name=DivOPDReplayBuffer \
  trainer.v1.sampler.max_off_policy_threshold=3 \
  +trainer.v1.sampler.sampler_kwargs.method=divopd \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node=4 \
  trainer.project_name=divopd \
  trainer.experiment_name=scienceworld-divopd \
  "$@"
