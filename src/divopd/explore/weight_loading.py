"""How a published weight version reaches the explorer's generator, and a generator's shutdown.

The explorer's student generates through an :class:`~divopd.explore.generation.HFGenerator` on its own model copy, or
through a generation backend built outside (``explorer.generation.backend: vllm``: a
:class:`~divopd.VLLMGenerator` that holds its own copy of the weights). :func:`apply_weights` loads a published
:class:`~divopd.learn.checkpoint.WeightHandle` into whichever of the two the explorer has, before its next rollout, and
times it (``time/weight_load_s``; the learner side of a publication is ``time/publish_s``).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["apply_weights", "close_backend"]


def apply_weights(handle: Any, student: Any | None, backend: Any) -> float:
    """Load ``handle`` into the HF ``student`` (when the explorer has one) and push it into ``backend`` (when it takes
    weight updates); returns the seconds it took."""
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
