"""What a model folder holds, read before a vLLM engine is built: its ``config.json``, whether vLLM's CPU kernels
can serve it, and its checkpoint's tensor names and shapes (what a weight update is checked against)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from divopd.errors import UsageError

__all__ = ["VLLMEngineError", "check_head_dim", "checkpoint_shapes", "read_model_config"]


class VLLMEngineError(UsageError, RuntimeError):
    """vLLM is missing, cannot load the model, or its engine kept dying."""


def read_model_config(model_path: str) -> dict[str, Any]:
    """The ``config.json`` of the model folder at ``model_path``, or :class:`VLLMEngineError` in one line."""
    path = Path(model_path)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise VLLMEngineError(f"{model_path}: not a model folder (no config.json); the vLLM backend loads a local "
                              "Hugging Face folder")
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise VLLMEngineError(f"{model_path}/config.json: not a readable JSON model config ({exc})") from None


def check_head_dim(model_path: str, config: dict[str, Any]) -> None:
    """The CPU attention kernel supports a fixed set of head sizes (not the tiny models' 16): fail in one line."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads and "hidden_size" in config else 0)
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        supported = [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]
    if head_dim and head_dim not in supported:
        raise VLLMEngineError(f"{model_path}: head_dim {head_dim} is not supported by vLLM's CPU attention kernel "
                              f"(supported: {', '.join(map(str, supported))}); use the hf backend for this model")


def checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """``name → shape`` of every tensor in the ``*.safetensors`` files of a model folder (read from the headers)."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise UsageError(f"{model_path}: no *.safetensors weights in the model folder (vLLM and the weight checks "
                         "read them)")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = tuple(fh.get_slice(name).get_shape())
    return shapes
