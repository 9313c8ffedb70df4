"""Pieces every runtime shares: the teacher, explorers and the evaluator built from a config (no runtime imports)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from divopd.errors import ConfigError
from divopd.experience.log.parts import log_files
from divopd.experience.log.schema import ExperienceLogError
from divopd.explore.explorer import Explorer
from divopd.explore.settings import VLLMSettings
from divopd.explore.teacher import HFTeacher, Teacher
from divopd.explore.vocab import VocabMatch, adapt_teacher, compare_vocabularies
from divopd.explore.weight_loading import apply_weights
from divopd.learn.checkpoint import WeightHandle
from divopd.models import load_model, load_tokenizer
from divopd.train.config import TrainConfig

__all__ = ["bridge_vocabularies", "build_explorer", "check_vocabularies", "explorer_seed",
           "fresh_session", "load_teacher", "logged_rollout_ids", "rollout_id_prefix", "step_limit", "vllm_generator"]

# transformers' from_pretrained swaps process-global state (meta-device init); loading in two threads at once races.
_LOAD_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def explorer_seed(cfg: TrainConfig, explorer_id: int, session: int, incarnation: int = 0) -> int:
    """Distinct, reproducible seeds per (run seed, explorer, resume session, incarnation: restarts within the
    session); an explorer never restarted keeps the seed it always had."""
    base = cfg.seed * 100_003 + session * 1_009 + explorer_id
    if incarnation == 0:
        return base
    entropy = [cfg.seed % 2**64, session, explorer_id, incarnation, 0x5EED]  # 0x5EED: apart from other streams
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])  # a uint32: valid for every backend


def rollout_id_prefix(session: int, incarnation: int = 0) -> str:
    """The rollout-id prefix ``s{session}x``, ``s{session}r{incarnation}x`` after a restart (ids never repeat)."""
    return f"s{session}x" if incarnation == 0 else f"s{session}r{incarnation}x"


_ID_SESSION = re.compile(r"s(\d+)")


def fresh_session(sessions: int, logged_ids: Iterable[str]) -> int:
    """The explorers' session number: ``sessions``, or the next one no logged rollout id (``s{s}x…``, ``s{s}r{k}x…``,
    threads restarts ``s{100 s + k}x…``) was made under, so ids after ``--resume`` never repeat a logged one."""
    used = {int(m.group(1)) for rid in logged_ids if (m := _ID_SESSION.match(rid))}
    blocked = used | {u // 100 for u in used}
    session = sessions
    while session in blocked:
        session += 1
    return session


def logged_rollout_ids(log_dir: Path) -> set[str]:
    """The rollout ids in the readable parts of the experience log at ``log_dir`` (none without a log)."""
    try:
        files = log_files(log_dir) if log_dir.is_dir() else []
    except ExperienceLogError:
        return set()
    ids: set[str] = set()
    for f in files:
        ids.update(pq.read_table(f, columns=["rollout_id"]).column("rollout_id").unique().to_pylist())
    return ids


def load_teacher(cfg: TrainConfig) -> tuple[Teacher, Any]:
    """The run's frozen teacher of ``teacher.backend`` and its tokenizer, scoring the student's token ids
    (:func:`bridge_vocabularies`)."""
    teacher: Teacher
    stop_on_newline = cfg.explorer.generation.stop_on_newline
    if cfg.teacher.backend == "server":
        from divopd.explore.teacher_server import ServerTeacher

        tokenizer = load_tokenizer(cfg.teacher.path)
        teacher = ServerTeacher(cfg.teacher.server, tokenizer, stop_on_newline=stop_on_newline)
    elif cfg.teacher.backend == "vllm":
        engine = vllm_generator(cfg.teacher.path, cfg.teacher.dtype, cfg.seed, cfg.teacher.vllm, cfg)
        teacher, tokenizer = engine, engine.tokenizer
    else:
        with _LOAD_LOCK:
            model, tokenizer = load_model(cfg.teacher.path, dtype=cfg.teacher.dtype, device=cfg.teacher.device)
        model.eval().requires_grad_(False)
        teacher = HFTeacher(model, tokenizer, max_tokens_per_batch=cfg.explorer.teacher_max_tokens_per_batch,
                            stop_on_newline=stop_on_newline)
    return bridge_vocabularies(cfg, teacher, tokenizer), tokenizer


def bridge_vocabularies(cfg: TrainConfig, teacher: Teacher, teacher_tokenizer: Any) -> Teacher:
    """``teacher`` as a Teacher of the student's token ids: itself, or wrapped
    (:func:`~divopd.explore.vocab.adapt_teacher`) after :func:`check_vocabularies`."""
    if cfg.teacher.tokenizer:
        teacher_tokenizer = load_tokenizer(cfg.teacher.tokenizer)
    match = check_vocabularies(cfg, teacher_tokenizer)
    if match.kind == "identical":
        return teacher
    log.info("teacher vocabulary: %s", match.describe())
    return adapt_teacher(teacher, load_tokenizer(cfg.student.path), teacher_tokenizer, match)


def check_vocabularies(cfg: TrainConfig, teacher_tokenizer: Any) -> VocabMatch:
    """The start-up vocabulary decision; a one-line :class:`~divopd.errors.ConfigError` for a ``cross`` teacher with
    ``teacher.cross_tokenizer: false`` or a teacher top-k that would hold ids the student lacks."""
    if cfg.teacher.path == cfg.student.path and not cfg.teacher.tokenizer:
        return VocabMatch("identical")
    topk = cfg.learner.estimator == "topk" or cfg.explorer.teacher_topk > 0
    match = compare_vocabularies(load_tokenizer(cfg.student.path), teacher_tokenizer,
                                 allow_cross=cfg.teacher.cross_tokenizer and not topk)
    source = f"teacher.tokenizer: {cfg.teacher.tokenizer}" if cfg.teacher.tokenizer else \
        f"teacher.path: {cfg.teacher.path}"
    sizes = f"{match.teacher_size} vs {match.student_size} tokens"
    if match.kind == "cross" and not cfg.teacher.cross_tokenizer:
        raise ConfigError(f"{source} has a different vocabulary from student.path {cfg.student.path} ({sizes}, not "
                          "an extension) and teacher.cross_tokenizer is false; set it true to map the teacher's log "
                          "probs onto the student's tokens (docs/concepts/teacher-vocabularies.md)")
    if topk and (match.kind == "cross" or match.teacher_only):
        raise ConfigError(f"learner.estimator: topk (explorer.teacher_topk) needs the teacher's top-k ids in the "
                          f"student's vocabulary, but {source} is {match.describe()}; use learner.estimator: sampled")
    return match


def build_explorer(cfg: TrainConfig, explorer_id: int, session: int, handle: WeightHandle | None,
                   teacher: Teacher | None, teacher_tokenizer: Any | None = None, evaluation: bool = False,
                   policy_version: int | None = None, incarnation: int = 0) -> Explorer:
    """An explorer with its own student copy at ``handle`` (or ``policy_version``) and the run's :func:`step_limit`;
    ``evaluation``: student-only (no teacher, recovery off, the full ``max_steps``)."""
    version = (0 if policy_version is None else policy_version) if handle is None else int(handle.version)
    student, backend = None, None
    if cfg.explorer.generation.backend == "vllm":
        seed = explorer_seed(cfg, explorer_id, session, incarnation)
        backend = vllm_generator(cfg.student.path, cfg.student.dtype, seed, cfg.explorer.generation.vllm, cfg,
                                 lora_rank=cfg.student.lora.rank)
        tokenizer = backend.tokenizer
        if version > 0:  # version 0 is the folder's own weights
            apply_weights(handle, None, backend)
    else:
        with _LOAD_LOCK:
            student, tokenizer = load_model(cfg.student.path, dtype=cfg.student.dtype, device=cfg.student.device)
        student.eval()
        if handle is not None:
            handle.load_into(student)
    explorer_cfg = cfg.explorer.model_copy(deep=True)
    if evaluation:
        explorer_cfg.recovery.enabled = False
        teacher = teacher_tokenizer = None
    return Explorer(explorer_cfg, student, tokenizer, teacher, teacher_tokenizer,
                    seed=explorer_seed(cfg, explorer_id, session, incarnation), explorer_id=explorer_id,
                    policy_version=version, id_prefix=rollout_id_prefix(session, incarnation),
                    student_backend=backend, step_limit=None if evaluation else partial(step_limit, cfg),
                    weights=handle)


def vllm_generator(path: str, dtype: str, seed: int, engine: VLLMSettings, cfg: TrainConfig,
                   lora_rank: int = 0) -> Any:
    """A :class:`~divopd.explore.vllm_engine.VLLMGenerator` for ``path``; ``lora_rank`` > 0: a LoRA student's."""
    from divopd.explore.vllm_engine import VLLMGenerator, lora_engine_kwargs

    with _LOAD_LOCK:
        return VLLMGenerator(path, dtype=dtype, seed=seed, stop_on_newline=cfg.explorer.generation.stop_on_newline,
                             **{**lora_engine_kwargs(lora_rank), **engine.generator_kwargs()})


def step_limit(cfg: TrainConfig, weights: WeightHandle | int) -> int:
    """A training explorer's step limit at ``weights`` (a handle or its version): ``explorer.max_steps``, TCOD-F2B's
    depth (:mod:`divopd.explore.tcod`) or TurnOPD's budget (:mod:`divopd.learn.turnopd`)."""
    handle = weights if isinstance(weights, WeightHandle) else None
    if cfg.turnopd.enabled:
        return cfg.turnopd.step_limit(cfg.explorer.max_steps, None if handle is None else handle.depth_disagreement)
    if not cfg.tcod.enabled:
        return cfg.explorer.max_steps
    tcod = cfg.tcod
    if tcod.total_updates is None:
        tcod = tcod.model_copy(update={"total_updates": cfg.updates})
    return tcod.horizon(cfg.explorer.max_steps, update=int(handle.version if handle is not None else weights))
