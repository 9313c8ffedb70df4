"""New weights for a running vLLM engine: checked against the checkpoint's tensors first (:func:`check_state_dict`),
then loaded in place (:func:`reload_in_place`) or broadcast over NCCL (:class:`NcclWeightSync`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from divopd.errors import UsageError

__all__ = ["WeightMismatchError", "NcclWeightSync", "check_state_dict", "handle_state_dict", "reload_in_place"]


class WeightMismatchError(UsageError, ValueError):
    """A weight update whose tensors do not fit the engine's model (missing, unexpected or mis-shaped)."""


def check_state_dict(state_dict: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], *,
                     tied: bool) -> list[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs to load, in the checkpoint's order (with ``tied`` embeddings ``lm_head.weight``
    last); :class:`WeightMismatchError` (one line) when a checkpoint tensor is missing, a name is unknown, a shape
    differs or a value is not a tensor."""
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected and not (tied and k.endswith("lm_head.weight"))]
    if missing or unexpected:
        raise WeightMismatchError(f"weight update does not fit the engine's model: missing {missing[:3]}"
                                  f"{' ...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                                  f"{' ...' if len(unexpected) > 3 else ''}; the engine is unchanged")
    pairs = []
    for name, shape in expected.items():
        t = state_dict[name]
        if not isinstance(t, torch.Tensor):
            raise WeightMismatchError(f"weight update: {name} is a {type(t).__name__}, not a tensor; the engine is "
                                      "unchanged")
        if tuple(t.shape) != shape:
            raise WeightMismatchError(f"weight update: {name} has shape {tuple(t.shape)}, the engine's model "
                                      f"{shape}; the engine is unchanged")
        pairs.append((name, t))
    if tied:  # vLLM's layer-wise reload re-creates the tied head too: it must be sent (the embeddings if absent)
        embed = next((n for n in expected if n.endswith("embed_tokens.weight")), None)
        head = next((k for k in state_dict if k.endswith("lm_head.weight")), None)
        if head is not None or embed is not None:
            pairs.append(("lm_head.weight", state_dict[head] if head is not None else state_dict[embed]))
    return pairs


def handle_state_dict(handle: Any) -> dict[str, torch.Tensor]:
    """The tensors of a published weight handle (``.state_dict``, or the ``*.safetensors`` of ``.path``)."""
    state = getattr(handle, "state_dict", None)
    if state is not None:
        return state
    path = getattr(handle, "path", None)
    if path is None:
        raise ValueError("weight handle has neither a state_dict nor a path")
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"weight handle: no *.safetensors in {path}")
    return {name: tensor for f in files for name, tensor in load_file(str(f)).items()}


def reload_in_place(llm: Any, pairs: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> None:
    """Load ``pairs`` into an in-process engine through the worker's layer-wise ``reload_weights`` (a bare
    ``model.load_weights`` fails on the CPU build: its loaded parameters no longer carry a ``weight_loader``)."""
    weights = [(name, t.detach().to("cpu", dtype=dtype).contiguous()) for name, t in pairs]
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})


class _DictSource:
    """A vLLM ``WeightSource`` over checked ``(name, tensor)`` pairs on one CUDA device (re-iterable)."""

    def __init__(self, pairs: list[tuple[str, torch.Tensor]], device: torch.device, dtype: torch.dtype) -> None:
        self.pairs = [(n, t.detach().to(device, dtype=dtype).contiguous()) for n, t in pairs]

    def metadata(self) -> list[Any]:
        from vllm.distributed.weight_transfer import ParamMeta

        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.pairs]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.pairs)


class _LLMClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an ``LLM`` object in this process."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)


class NcclWeightSync:
    """Broadcast new weights into a GPU engine's workers over NCCL (vLLM's dense ``nccl`` weight-transfer backend;
    the engine built with ``weight_transfer_config={"backend": "nccl"}``): this process is rank 0 of a group with the
    engine's ``world_size`` workers, opened on the first :meth:`send`."""

    def __init__(self, llm: Any, *, world_size: int, device: str = "cuda:0") -> None:
        if not torch.cuda.is_available():
            raise UsageError("vllm weight_sync 'nccl' needs a CUDA GPU; on a CPU engine use weight_sync 'reload'")
        self.llm, self.world_size, self.device = llm, world_size, torch.device(device)
        self._engine: Any = None
        self._source: Any = None

    def send(self, pairs: list[tuple[str, torch.Tensor]], dtype: torch.dtype, version: int) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        source = _DictSource(pairs, self.device, dtype)
        if self._engine is None:
            self._source = source
            info = NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=_free_port(),
                                       world_size=self.world_size + 1, rank=0)
            self._engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=_LLMClient(self.llm),
                                                                        source=self._source)
        else:
            self._source.pairs = source.pairs  # the engine replays its source every round
        self._engine.send_weights()
        self.llm.llm_engine.set_weight_version(str(version))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
