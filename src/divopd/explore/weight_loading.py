"""How a published weight version reaches the explorer's generator (its HF student copy, or a backend such as a vLLM
engine that holds its own weights), and a generator's shutdown."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["apply_weights", "close_backend"]


def apply_weights(handle: Any, student: Any | None, backend: Any) -> float:
    """Load ``handle`` into the HF ``student`` (if any) and push it into ``backend`` (if it takes weight updates);
    returns the seconds it took (``time/weight_load_s``)."""
    t0 = time.perf_counter()
    if student is not None:
        handle.load_into(student)
    push = getattr(backend, "update_weights", None)
    if push is not None and getattr(handle, "adapter", None) is not None:  # a LoRA student: the adapter version
        from divopd.learn.lora import handle_adapter

        backend.update_adapter(handle_adapter(handle), handle.adapter, version=int(handle.version))
    elif push is not None:
        from divopd.explore.vllm_weights import handle_state_dict

        push(handle_state_dict(handle), version=int(handle.version))
    return time.perf_counter() - t0


def close_backend(backend: Any) -> None:
    """Shut down a generation backend that owns an engine (HF generators own nothing)."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()
