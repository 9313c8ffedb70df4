"""One rank of the sharded learner: a :class:`~divopd.learn.learner.Learner` whose model is FSDP2-sharded. Each rank
scales its loss by N to undo FSDP2's gradient average (exact for N a power of two); clipping uses the global norm.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from divopd.learn.inputs import UpdateInputs
from divopd.learn.learner import Learner
from divopd.learn.lora import LoraSettings, has_adapter, load_student
from divopd.learn.rendezvous import rendezvous_store
from divopd.learn.settings import LearnerConfig
from divopd.learn.update import MicroBatchOutput, RankStep

__all__ = ["RankWorker", "decoder_layers", "free_port", "shard_model"]

#: The default seconds a collective (and the rendezvous) waits for a peer (``runtime.collective_timeout_s``).
COLLECTIVE_TIMEOUT_S = 600.0


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (HF ``_no_split_modules`` classes, e.g. ``LlamaDecoderLayer``), in order."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard (no _no_split_modules match)")
    return layers


def _apply_activation_checkpointing(model: torch.nn.Module) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    targets = {id(m) for m in decoder_layers(model)}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                parent.register_module(name, checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT))


def shard_model(model: torch.nn.Module, mesh: Any, config: LearnerConfig) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root (FSDP2 averages the gradients over ranks)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if config.activation_checkpointing:
        _apply_activation_checkpointing(model)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if config.mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


class _RankLearner(Learner):
    """The learner on one rank: clipping by the global norm of the sharded gradients."""

    def _grad_norm(self) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        norm = super()._grad_norm()
        return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype).numpy()


class RankWorker:
    """One learner rank, whose public methods a transport (a spawned process or a Ray actor per rank) calls."""

    def __init__(self) -> None:
        self.learner: _RankLearner | None = None
        self.rank = -1
        self.world_size = 1
        self.lora = False  # a LoRA student: only the adapter's (trainable) tensors are gathered and saved

    def setup(self, rank: int, world_size: int, init_method: str, source: str, config: dict[str, Any],
              threads: int = 1, deterministic: bool = False, local_device: int | None = None,
              collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, lora: dict[str, Any] | None = None
              ) -> dict[str, Any]:
        """Join the process group, load ``source`` (with fresh adapters when ``lora`` asks), shard it and build the
        optimizer over its trainable tensors; collectives fail after ``collective_timeout_s`` without their peers."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        cfg = LearnerConfig(**config)
        device = torch.device(cfg.device)
        if device.type == "cuda":
            device = torch.device("cuda", rank if local_device is None else local_device)
            torch.cuda.set_device(device)
            cfg = cfg.model_copy(update={"device": str(device)})
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=collective_timeout_s)
        dist.init_process_group(backend, store=rendezvous_store(init_method, rank, world_size, timeout),
                                rank=rank, world_size=world_size, timeout=timeout)
        self.rank, self.world_size = rank, world_size
        mesh = init_device_mesh(device.type, (world_size,))
        settings = None if lora is None else LoraSettings(**lora)
        model, tokenizer = load_student(source, dtype=cfg.dtype, device=str(device), lora=settings, seed=cfg.seed)
        self.lora = has_adapter(model)
        self.fqns = [n for n, p in model.named_parameters() if p.requires_grad]
        shard_model(model, mesh, cfg)
        self.learner = _RankLearner(model, cfg, tokenizer)
        return {"rank": rank, "pid": os.getpid(), "node": socket.gethostname(), "device": str(device),
                "backend": backend}

    def step(self, inputs: UpdateInputs, groups: list[np.ndarray], n_rows: int, total_valid: int,
             weights: np.ndarray | None) -> RankStep:
        """Forward/backward of this rank's rows (global denominators), then the sharded clip and AdamW step."""
        import resource  # POSIX only: imported where a rank runs

        learner = self._learner()
        learner.optimizer.zero_grad(set_to_none=True)
        acc = learner.accumulate(inputs, groups, weights, n_rows=n_rows, total_valid=total_valid, weighted=True,
                                 scale=float(self.world_size))
        t0 = time.perf_counter()
        grad_norm, skipped = learner._optimizer_step()
        cuda = learner.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(learner.device)
        outputs = [MicroBatchOutput(o.idx, _np(o.logprobs), _np(o.old_logprobs), _np(o.topk_logprobs), _np(o.scored))
                   for o in acc.outputs]
        return RankStep(outputs=outputs, tokens=acc.tokens, input_slots=acc.input_slots, t_fb=acc.t_fb,
                        t_opt=time.perf_counter() - t0, grad_norm=grad_norm, skipped=skipped,
                        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                        peak_cuda_mb=torch.cuda.max_memory_allocated(learner.device) / 2**20 if cuda else 0.0)

    def _options(self, **kwargs: Any) -> Any:
        """State-dict options; a LoRA student's leave out the frozen base (``ignore_frozen_params``)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=self.lora, **kwargs)

    def _trained(self, state: dict[str, Any]) -> dict[str, Any]:
        """A LoRA student's trained tensors only (``ignore_frozen_params`` keeps a tied frozen head)."""
        return {k: v for k, v in state.items() if k in self.fqns} if self.lora else state

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank takes part; rank 0 returns the full CPU state dict (a LoRA student's adapter only)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        options = self._options(full_state_dict=True, cpu_offload=True)
        state = self._trained(get_model_state_dict(self._learner().model, options=options))
        return state if self.rank == 0 else None

    def _sharded_state(self) -> dict[str, Any]:
        """This rank's model (a LoRA student's trained tensors) and optimizer state, as DCP saves and loads them."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        learner = self._learner()
        model_state, optim_state = get_state_dict(learner.model, learner.optimizer, options=self._options())
        return {"model": self._trained(model_state), "optim": optim_state}

    def save(self, path: str) -> None:
        """Model and optimizer shards into the DCP folder ``path`` (a LoRA student's adapter and its state only)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._sharded_state(), checkpoint_id=path)

    def load(self, path: str) -> None:
        """Resume from a :meth:`save` directory written by any number of ranks (DCP reshards on load)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from divopd.learn import safe_dcp as dcp  # the index and values read without unpickling code

        learner = self._learner()
        state = self._sharded_state()
        dcp.load(state, checkpoint_id=path)
        # a LoRA student loads every trained tensor (DCP fails on a missing one); the frozen base stays as loaded
        set_state_dict(learner.model, learner.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=self._options(strict=not self.lora))

    def load_full_optimizer(self, path: str) -> None:
        """Resume the optimizer from a single-process checkpoint's ``optimizer.pt`` (indexed by parameter order)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        learner = self._learner()
        saved = torch.load(path, map_location="cpu", weights_only=True)
        by_name = {"state": {self.fqns[i]: s for i, s in saved["state"].items()},
                   "param_groups": [{**g, "params": [self.fqns[i] for i in g["params"]]}
                                    for g in saved["param_groups"]]}
        set_optimizer_state_dict(learner.model, learner.optimizer, optim_state_dict=by_name,
                                 options=StateDictOptions(full_state_dict=True))

    def set_state(self, version: int) -> None:
        self._learner().version = version

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def _learner(self) -> _RankLearner:
        if self.learner is None:
            raise RuntimeError("learner rank used before setup()")
        return self.learner
