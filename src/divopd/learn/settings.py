"""The learner's settings (:class:`LearnerConfig`, YAML key ``learner``); also importable from
:mod:`divopd.learn.learner`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LearnerConfig"]


class LearnerConfig(BaseModel):
    """Learner settings (YAML key ``learner``)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2).")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    grad_clip: float = Field(
        1.0, description="Max global gradient L2 norm; <= 0 disables clipping (norm still logged).")
    beta: float = Field(
        1.0, description="Distillation coefficient β of the stopped advantage A = −β·sg(logπ_θold − logπ_T).")
    clip_eps: float = Field(0.2, ge=0, description="PPO clip ε; inactive with one update per batch (r = 1).")
    reduction: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"] = Field(
        "seq-mean-token-mean",
        description="Loss aggregation; the paper's seq-mean-token-mean keeps dead rows in the denominator.",
    )
    estimator: Literal["sampled", "topk"] = Field(
        "sampled",
        description="'sampled' = the paper's sampled-token advantage (opd_loss); 'topk' = reverse KL on the teacher's "
        "top-k support (needs Turn.teacher_topk_*; non-default, for tiny/early students that learn slowly).",
    )
    topk: int = Field(0, ge=0, description="Top-k estimator: teacher top-k columns used (first k); 0 = all stored.")
    topk_tail: bool = Field(
        False, description="Top-k estimator: keep full-vocabulary probabilities on the top-k and the rest as one tail "
        "category, so the student's mass on tokens outside the teacher's top-k is penalised (default: renormalise "
        "both on the top-k, which does not see it).")
    max_prompt_len: int | None = Field(
        None, ge=1, description="Left-truncate longer prompts to this many tokens (not turns the explorer flagged).")
    packing: Literal["padded", "packed"] = Field(
        "packed", description="Input layout: 'packed' (padding-free, block-diagonal attention) or 'padded'.")
    micro_batch_tokens: int = Field(
        0, ge=0, description="Split a batch into micro-batches of at most this many tokens (gradient accumulation, "
        "same loss); 0 = one pass.")
    old_logprobs: Literal["same-pass", "recompute"] = Field(
        "same-pass", description="θ_old log probs: detached values of the gradient pass (equal with one update per "
        "batch) or a separate no-grad forward.")
    turn_balance_updates: int | None = Field(
        None, ge=1, description="TurnOPD's loss schedule (our reading): row weights move the seq-mean-token-mean loss "
        "from token-level (alpha 0: token-mean) to turn-balanced (alpha 1: each turn's KL divided by its length) "
        "linearly over this many updates; null = unit row weights (the paper's loss).")
    depth_stats: bool = Field(
        False, description="Keep running per-turn-depth disagreement means and publish them with the weights "
        "(TurnOPD's adaptive depth budget reads them; see divopd.learn.turnopd).")
    dtype: str = Field("float32", description="Model/training dtype: float32 | bfloat16 | float16.")
    device: str = Field("cpu", description="Torch device of the learner, e.g. cpu or cuda:0.")
    seed: int = Field(0, description="Seed of torch's RNG at learner start (restored on resume).")
    world_size: int = Field(
        1, ge=1, description="Learner ranks: 1 = one process (the default learner); N > 1 = N ranks with "
        "torch.distributed and FSDP2 (fully_shard per decoder layer, then the whole model), the batch's rows split "
        "across them with the global N-row loss denominator (gloo on CPU, NCCL on CUDA; see concepts/distributed).")
    mixed_precision: Literal["none", "bf16"] = Field(
        "none", description="Sharded learner (world_size > 1): 'bf16' = bf16 parameters and compute with fp32 "
        "gradient reduction (FSDP2 MixedPrecisionPolicy; meant for GPUs), 'none' = the model's dtype throughout.")
    activation_checkpointing: bool = Field(
        False, description="Sharded learner: recompute each decoder layer's activations in the backward pass "
        "(less memory, ~30% more compute).")
