"""The explorer's settings: :class:`ExplorerConfig` (environment, instances, prompts, teacher scoring, +R) and the
student's decoding (:class:`GenerationSettings`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from divopd.explore.prompting import PromptConfig
from divopd.explore.recovery import RecoveryConfig

__all__ = ["ExplorerConfig", "GenerationSettings", "VLLMSettings"]


class VLLMSettings(BaseModel):
    """Options of a vLLM engine (``backend: vllm``; :class:`divopd.VLLMGenerator`); its dtype is the model's
    (``student.dtype`` / ``teacher.dtype``) and its seed the run seed."""

    model_config = ConfigDict(extra="forbid")

    max_model_len: int | None = Field(None, ge=2, description="Engine context length (prompt + generated tokens); "
                                      "None = the model's. Must hold explorer.prompt.max_prompt_tokens + "
                                      "max_new_tokens.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory for the engine (on the CPU build: of host memory); "
        "None = vLLM's default on GPU, a fixed kv_cache_memory_bytes on CPU.")
    kv_cache_memory_bytes: int | None = Field(None, ge=1, description="KV-cache size in bytes (None: 512 MiB on "
                                              "CPU unless gpu_memory_utilization is set; vLLM's default on GPU).")
    enable_prefix_caching: bool = Field(True, description="Reuse the KV cache of shared prompt prefixes (multi-turn "
                                        "prompts share their history); reset after every weight update.")
    enforce_eager: bool = Field(False, description="No torch.compile / CUDA graphs (faster start, slower steps).")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine.")
    weight_sync: Literal["auto", "reload", "nccl"] = Field(
        "auto", description="How published weights enter the engine: reload (in place, engine in this process; the "
        "CPU path), nccl (vLLM's NCCL weight transfer; GPU) or auto (nccl with CUDA, else reload).")
    sync_device: str | None = Field(None, description="weight_sync nccl: the GPU the explorer sends from (default "
                                    "cuda:<tensor_parallel_size>, the first after the engine's).")
    max_restarts: int = Field(2, ge=0, description="Engine rebuilds after a failed call before the explorer fails.")
    call_timeout_s: float = Field(
        600.0, gt=0, description="Deadline of one engine call (generate, score, weight update). An in-process call "
        "cannot be interrupted: past it the engine is marked stalled (one error line naming the engine and the call) "
        "and the loop watchdog (runtime.stall_timeout_s) stops the run.")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Any other vllm.LLM arguments.")

    def generator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~divopd.explore.vllm_engine.VLLMGenerator` (besides path, dtype, seed)."""
        return {**self.model_dump(exclude={"engine_kwargs"}, exclude_none=True), **self.engine_kwargs}


class GenerationSettings(BaseModel):
    """How the student generates its actions during training rollouts (evaluation: ``eval.temperature`` or
    ``eval.greedy``)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(16, ge=1, description="At most this many tokens per action.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of training rollouts (the paper's 1.0; "
                               "the stored log probs are at T=1). Evaluation uses eval.temperature.")
    greedy: bool = Field(False, description="Greedy decoding for training rollouts too (default: sample).")
    stop_on_newline: bool = Field(True, description="Stop an action at the first newline token as well as at eos.")
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="Student generation: hf (transformers generate on the explorer's model copy) or vllm (a "
        "vLLM engine per explorer that receives every published weight version before its next rollout).")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="Engine options of backend: vllm.")


class ExplorerConfig(BaseModel):
    """One explorer: which environment, how many instances, prompts, generation, teacher scoring and +R."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("twx", description="Environment registry name (divopd.explore.envs.make_env): twx "
                     "(= textworld-express), scienceworld, tiny, webshop, webshop-offline, alfworld; or an import "
                     "path module:Class of an Env subclass (e.g. mypkg.envs:MyEnv), importable wherever explorers run.")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Constructor arguments of the environment.")
    num_envs: int = Field(4, ge=1, description="Env instances stepped in lockstep, one batched generate per turn.")
    split: str = Field("train", description="Task split for training rollouts.")
    task_order: Literal["shuffle", "cycle"] = Field(
        "shuffle", description="Training tasks: `shuffle` (a seeded random order per explorer, reshuffled every "
        "pass) or `cycle` (the split's own order, over and over; the ScienceWorld paper split is shuffled once "
        "with seed 42 and cycled, Appendix Table 6). Explorer i starts i tasks in.")
    eval_split: str = Field("dev", description="Held-out task split for evaluation.")
    eval_tasks: int = Field(50, ge=1, description="Deprecated in a run config: use eval.tasks (a config that sets this "
                            "still loads, with one warning). The explorer's default for evaluate().")
    max_steps: int = Field(20, ge=1, description="Step limit per rollout (student and teacher steps together).")
    enqueue: Literal["rollout", "turn"] = Field(
        "rollout", description="When student turns enter the queue: `rollout` (all of a rollout's turns together, "
        "teacher-scored in one pass when it ends) or `turn` (every env round, the round's new student turns of all "
        "instances are teacher-scored in one pass and queued at once, while their rollouts go on; the queue then "
        "holds turns of many running rollouts, and a turn's `success` is known only for its rollout's last turn).")
    load_weights: Literal["rollout", "batch"] = Field(
        "rollout", description="When the explorer loads newly published weights: `rollout` (whenever one of its "
        "rollouts ends, so the other instances' running rollouts go on with the new weights and one rollout's turns "
        "may carry several policy versions) or `batch` (an instance whose rollout ended waits until every instance's "
        "rollout has ended; then the newest weights load and all instances start again: every turn of a rollout has "
        "one policy version, as in an explorer that runs a batch of episodes per weight sync).")
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="Prompt template and context budget.")
    truncated_turns_dead: bool = Field(
        True, description="A turn whose prompt was truncated (past prompt.max_prompt_tokens) gets an all-False "
        "teacher-valid mask: the teacher never saw its real context, so a reader without the validity gate (vanilla) "
        "trains on it as a dead row, as on the paper's ALFWorld and WebShop; the gate rejects it either way. False = "
        "keep the teacher's scores of the truncated prompt.")
    generation: GenerationSettings = Field(default_factory=GenerationSettings, description="Student decoding.")
    teacher_max_tokens_per_batch: int = Field(
        8192, ge=1, description="Teacher scoring packs at most this many prompt+response tokens per forward pass.")
    teacher_topk: int = Field(
        0, ge=0, description="Also keep the teacher's top-k log probs per token (for the top-k reverse-KL estimator).")
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig, description="+R teacher recovery.")
    max_env_restarts: int = Field(3, ge=1, description="Consecutive failed env (re)starts before the explorer fails.")

