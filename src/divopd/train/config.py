"""Training configuration: a setting's YAML file (following ``base:``) with its method row's switches on
(:func:`~divopd.sampling.registry.row_switches`) and ``--set a.b=c`` overrides applied last, validated by one typed
tree (:class:`TrainConfig`) and checked against the row (:func:`~divopd.sampling.registry.check_row`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from divopd.errors import ConfigError, describe_validation_error
from divopd.explore.envs import SPLITS, check_env_name
from divopd.explore.settings import ExplorerConfig, VLLMSettings
from divopd.explore.tcod import TCODConfig
from divopd.explore.teacher_server import ServerSettings
from divopd.learn.lora_settings import LoraSettings
from divopd.learn.settings import LearnerConfig
from divopd.learn.turnopd import TurnOPDConfig
from divopd.sampling import METHODS, ROWS, SamplerConfig, method_names
from divopd.sampling.registry import check_row
from divopd.sampling.settings import sampler_kwargs, settings_model
from divopd.train.config_load import (
    apply_overrides,
    deep_merge,
    override_for,
    read_yaml,
    unknown_key,
    unknown_key_line,
    with_method,
)
from divopd.train.packaged import config_path

__all__ = ["METHOD_ROWS", "PLACEMENT_KEYS", "TrainConfig", "apply_overrides", "config_reference", "dump_config",
           "load_config", "sampler_method_for", "with_method"]

#: Keys that say where a run executes, not what it computes: ``--resume`` may change them, and the seeds of one method
#: may differ in them (``divopd report``).
PLACEMENT_KEYS = ("learner.world_size", "learner.activation_checkpointing", "runtime.ray_address",
                  "runtime.learner_gpus")

#: Method rows of the paper that are not sampler names, and the sampler rule each one reads batches with.
METHOD_ROWS: dict[str, str] = {name: row.rule for name, row in ROWS.items() if row.rule != name}


def sampler_method_for(method: str) -> str:
    """The sampler rule of a method row (``divopd-r`` → ``divopd``; a sampler name is its own)."""
    row = ROWS.get(method)
    return row.rule if row is not None else method


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelRef(_Strict):
    """A causal LM to load (any ``AutoModelForCausalLM`` name or folder)."""

    path: str = Field(description="HF model name or local folder (e.g. one written by `divopd sft`).")
    dtype: str = Field("float32", description="float32 | bfloat16 | float16.")
    device: str = Field("cpu", description="Torch device for this model (explorers and teacher scoring).")


class StudentRef(ModelRef):
    """The student: a causal LM, trained whole or through LoRA adapters (``lora.rank > 0``)."""

    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters; rank 0 = full fine-tuning.")


class TeacherRef(ModelRef):
    """The frozen teacher: the model and the engine that scores (and, under +R, acts) with it."""

    backend: Literal["hf", "vllm", "server"] = Field(
        "hf", description="Teacher scoring: hf (a no-grad forward), vllm (a vLLM engine's prompt log probs) or server "
        "(an OpenAI-compatible server, teacher.server; teacher.path: the served model's folder, for its tokenizer).")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="Engine options of backend: vllm.")
    server: ServerSettings = Field(default_factory=ServerSettings, description="The teacher server of backend: "
                                   "server (docs/concepts/teacher.md).")
    shared: bool = Field(False, description="runtime.kind ray: one teacher actor scores for every explorer instead "
                         "of one teacher per explorer actor (ignored by the other runtimes, which share one already).")
    actor_gpus: float = Field(0.0, ge=0, description="Ray: GPUs reserved for the shared teacher actor.")
    tokenizer: str | None = Field(
        None, description="The teacher's tokenizer (HF name or folder; default the teacher model's own), compared "
        "with the student's at start (docs/concepts/teacher-vocabularies.md).")
    cross_tokenizer: bool = Field(
        True, description="A teacher with another vocabulary (not an extension) scores the student's text in its own "
        "tokens, mapped onto the student's by character spans (our reading); false = refuse it at start. "
        "learner.estimator: topk needs a shared vocabulary.")


#: The ``sampler:`` section, generated from the one table of sampler settings (divopd.sampling.settings).
SamplerSettings = settings_model(_Strict)


class EvalSettings(_Strict):
    """Student-only evaluation on held-out tasks, beside training on a weight snapshot (and by `divopd eval`)."""

    every: int = Field(10, ge=1, description="Evaluate every N learner updates.")
    tasks: int = Field(50, ge=1, description="Held-out tasks per evaluation (first N of explorer.eval_split).")
    at_start: bool = Field(True, description="Also evaluate the initial student (update 0).")
    temperature: float = Field(
        0.4, gt=0, description="Sampling temperature of evaluation episodes (the paper's 0.4), seeded by the run "
        "seed: the same weights give the same result.")
    greedy: bool = Field(False, description="Greedy decoding for evaluation instead of sampling at eval.temperature.")

    def sampling(self, seed: int) -> dict[str, Any]:
        return {"temperature": self.temperature, "greedy": self.greedy, "seed": seed}


class CheckpointSettings(_Strict):
    every: int = Field(25, ge=1, description="Checkpoint every N learner updates (and at the end / on Ctrl-C).")
    keep: int = Field(2, ge=1, description="Keep the newest N checkpoints.")


class DiagnosticsSettings(_Strict):
    """Appendix E audits, computed on the composed batch before its update (costly: off by default)."""

    every: int = Field(0, ge=0, description="Run E.2 (focus ranking stability) and E.3 (gradient projection onto "
                       "the pool gradient, pairwise cosines) every N updates; 0 = never.")
    max_rows: int = Field(64, ge=2, description="E.3: per-row gradients of at most this many batch rows.")


class LockstepSettings(_Strict):
    """The lockstep runtime's producer model (one process, deterministic)."""

    env_steps_per_update: int = Field(
        16, ge=1, description="Env steps (all instances together, round-robin) before each learner update: the "
        "producer-load knob (arrival/drain ≈ this × student turns per step ÷ B).")


class RuntimeSettings(_Strict):
    """How explorers and the learner run (the same loop and code under every kind)."""

    kind: Literal["threads", "lockstep", "ray"] = Field("threads", description="threads (explorer threads, one "
                                                        "process), lockstep (one process, no threads, deterministic) "
                                                        "or ray (explorer actors).")
    lockstep: LockstepSettings = Field(default_factory=LockstepSettings, description="runtime.kind: lockstep only.")
    num_explorers: int = Field(1, ge=1, description="Explorer workers, each with its own student copy and envs.")
    queue_rollouts: int = Field(64, ge=1, description="Bounded rollout queue between explorers and learner.")
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads per worker (1 is best on 2 cores).")
    ray_address: str | None = Field(None, description="Ray cluster address; None starts a local Ray on loopback.")
    ray_num_cpus: int | None = Field(None, ge=1, description="CPUs of the local Ray instance (None = all).")
    explorer_cpus: float = Field(1.0, ge=0, description="Ray: CPUs reserved per explorer actor.")
    explorer_gpus: float = Field(0.0, ge=0, description="Ray: GPUs reserved per explorer actor.")
    max_explorer_restarts: int = Field(3, ge=0, description="Ray: restarts of a dead explorer actor.")
    stall_timeout_s: float = Field(
        1800.0, ge=0, description="Loop watchdog: stop the run (checkpoint, summary.json `stalled`, exit 3) after this "
        "many seconds without a rollout or an update, or when the last 4·sampler.batch_size turns lack teacher "
        "scores; 0 = off.")
    rejected_turns_warning: int = Field(
        1000, ge=1, description="Gate watch: warn (naming the top rejection reason and its config key) once this many "
        "turns were rejected by the validity gate since the last update; at 4× as many the watchdog stops the run as "
        "a stall (off with runtime.stall_timeout_s 0).")
    teacher_timeout_s: float = Field(
        600.0, gt=0, description="Ray, teacher.shared: deadline of one call to the shared teacher actor; past it the "
        "actor is killed for a restart and the call's turns are retried one by one, else left unscored.")
    max_teacher_restarts: int = Field(3, ge=0, description="teacher.shared: restarts of a dead or stalled teacher.")
    explorer_timeout_s: float = Field(
        1200.0, gt=0, description="Ray: deadline of one explorer actor's rollout; past it the actor is killed and "
        "restarted (runtime.max_explorer_restarts), its rollout lost. Keep it below runtime.stall_timeout_s.")
    collective_timeout_s: float = Field(
        600.0, gt=0, description="learner.world_size > 1: deadline of one collective among the learner ranks and of "
        "the rendezvous; a lost rank stops the run within it, its newest good checkpoint in place.")
    rank_call_timeout_s: float = Field(
        3600.0, gt=0, description="learner.world_size > 1: the longest the driver waits for the first rank's answer "
        "to one call (setup, an update, a checkpoint write); past it the run stops. Keep it above the slowest update.")
    explorer_resources: dict[str, float] = Field(
        default_factory=dict, description="Ray: custom resources per explorer actor (e.g. {explorer_node: 1}).")
    learner_cpus: float = Field(1.0, ge=0, description="Ray, learner.world_size > 1: CPUs per learner rank actor.")
    learner_gpus: float = Field(
        0.0, ge=0, description="Ray, learner.world_size > 1: GPUs per learner rank actor (one placement-group bundle "
        "per rank; with GPUs set learner.device: cuda).")
    learner_resources: dict[str, float] = Field(
        default_factory=dict, description="Ray: custom resources per learner rank bundle (e.g. {learner_node: 1}).")


class TrainConfig(_Strict):
    """Everything `divopd train` needs."""

    setting: str = Field(description="Name of the experimental setting (groups runs in `divopd report`).")
    method: str = Field(description="Method row: a sampler method, or divopd-r / tcod-f2b / turnopd.")
    seed: int = Field(0, ge=0, description="Seeds the learner, sampler and explorers.")
    out_dir: str = Field("runs", description="Runs are written to out_dir/<setting>/<method>/seed<seed>.")
    run_dir: str | None = Field(None, description="Explicit run directory (overrides out_dir layout).")
    updates: int = Field(100, ge=1, description="Learner updates to run.")
    max_seconds: float | None = Field(None, gt=0, description="Stop (and checkpoint) after this much wall time.")
    student: StudentRef
    teacher: TeacherRef
    sampler: SamplerSettings = Field(default_factory=SamplerSettings)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    tcod: TCODConfig = Field(default_factory=TCODConfig)
    turnopd: TurnOPDConfig = Field(default_factory=TurnOPDConfig)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    diagnostics: DiagnosticsSettings = Field(default_factory=DiagnosticsSettings)
    log_experience: bool = Field(True, description="Write every queued turn to the run's experience log.")
    log_token_ids: bool = Field(
        True, description="Store token ids in the experience log (--resume re-queues the turns logged after the last "
        "checkpoint from them; without them those turns are dropped).")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        row = ROWS.get(self.method)
        if row is None or row.rule not in METHODS:
            raise ValueError(f"method: unknown method {self.method!r}; known: {', '.join(method_names())}")
        problem = check_row(row, self.get)
        if problem is not None:
            raise ValueError(problem)
        if self.turnopd.enabled and not self.learner.depth_stats:
            raise ValueError("turnopd.enabled needs learner.depth_stats: true (the depth budget reads its statistics)")
        if self.turnopd.enabled and self.tcod.enabled:
            raise ValueError("turnopd.enabled and tcod.enabled both set a depth limit; enable one of them")
        check_env_name(self.explorer.env)
        for key in ("split", "eval_split"):
            if getattr(self.explorer, key) not in SPLITS:
                raise ValueError(f"explorer.{key}: unknown split {getattr(self.explorer, key)!r}; "
                                 f"expected one of {', '.join(SPLITS)}")
        if "eval_tasks" in self.explorer.model_fields_set and self.explorer.eval_tasks != self.eval.tasks:
            raise ValueError("explorer.eval_tasks: not a run-config key; eval.tasks sets the tasks per evaluation")
        self.explorer.eval_tasks = self.eval.tasks  # the explorer's own default, equal to the run's
        need = self.explorer.prompt.max_prompt_tokens + self.explorer.generation.max_new_tokens
        for key, backend, engine in (("explorer.generation", self.explorer.generation.backend,
                                      self.explorer.generation.vllm), ("teacher", self.teacher.backend,
                                                                       self.teacher.vllm)):
            if backend == "vllm" and engine.max_model_len is not None and engine.max_model_len < need:
                raise ValueError(f"{key}.vllm.max_model_len: {engine.max_model_len} cannot hold a prompt of "
                                 f"explorer.prompt.max_prompt_tokens + max_new_tokens = {need} tokens")
        return self

    def get(self, key: str) -> Any:
        """The value of a dotted config key (``explorer.recovery.enabled``); ``KeyError`` naming it when unknown."""
        node: Any = self
        for part in key.split("."):
            if not isinstance(node, BaseModel) or part not in type(node).model_fields:
                raise KeyError(f"no config key {key!r}")
            node = getattr(node, part)
        return node

    def sampler_config(self) -> SamplerConfig:
        """The :class:`SamplerConfig` of this run."""
        return SamplerConfig(method=sampler_method_for(self.method), seed=self.seed, **sampler_kwargs(self.sampler))

    def resolved_run_dir(self) -> Path:
        if self.run_dir:
            return Path(self.run_dir)
        return Path(self.out_dir) / self.setting / self.method / f"seed{self.seed}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> TrainConfig:
    """Read a config (a YAML path or a setting name), switch on its method row's features, apply ``--set``
    overrides, validate; every problem is a one-line :class:`~divopd.errors.ConfigError` naming file and key."""
    overrides = overrides or []
    path = config_path(path) if path is not None else None
    raw = read_yaml(path, TrainConfig) if path is not None else {}
    if data:
        unknown = unknown_key(TrainConfig, data)
        if unknown is not None:
            raise ConfigError(unknown_key_line(TrainConfig, unknown))
        raw = deep_merge(raw, data)
    method = apply_overrides(raw, overrides, TrainConfig).get("method")
    raw = apply_overrides(with_method(raw, method), overrides)
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as exc:
        message = describe_validation_error(exc)
        first = exc.errors(include_url=False)[0]
        key = ".".join(str(p) for p in first.get("loc", ())) or message.split(":", 1)[0]
        item = override_for(overrides, key)
        where = f"--set {item}: " if item is not None else f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}{message}") from exc


def dump_config(cfg: TrainConfig) -> str:
    """The resolved config as YAML (written to every run directory)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def config_reference() -> list[tuple[str, str, str, str]]:
    """Every config key as ``(dotted key, type, default, description)`` (the config reference page)."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, key + ".")
                continue
            if field.is_required():
                default = "required"
            else:
                value = field.get_default(call_default_factory=True)
                default = json.dumps(value) if not isinstance(value, BaseModel) else ""
            if get_origin(ann) is Literal:
                type_name = " / ".join(str(a) for a in get_args(ann))
            else:
                type_name = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
            rows.append((key, type_name, default, (field.description or "").replace("|", "\\|")))

    walk(TrainConfig, "")
    return rows
