"""How a published weight version reaches the explorer's generator (its HF student copy, or a backend that holds its
own weights: a vLLM engine), the student copy's weights on disk (a lockstep checkpoint), and a backend's shutdown."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["apply_weights", "close_backend", "load_student", "save_student"]


def apply_weights(handle: Any, student: Any | None, backend: Any) -> float:
    """Load ``handle`` into the HF ``student`` (when the explorer has one) and push it into ``backend`` (when it takes
    weight updates); returns the seconds it took."""
    t0 = time.perf_counter()
    if student is not None:
        handle.load_into(student)
    push = getattr(backend, "update_weights", None)
    if push is not None:
        from divopd.explore.vllm_weights import handle_state_dict

        push(handle_state_dict(handle), version=int(handle.version))
    return time.perf_counter() - t0


def close_backend(backend: Any) -> None:
    """Shut down a generation backend that owns an engine (HF generators own nothing)."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()


def save_student(student: Any, path: Path) -> None:
    """Write an explorer's HF student copy's weights to ``path`` (safetensors; temporary name, then rename)."""
    from safetensors.torch import save_model

    if student is None:
        raise ValueError("save_student: the explorer has no HF student copy (a vLLM engine holds its weights)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_model(student, str(tmp))
    tmp.replace(path)


def load_student(student: Any, path: Path) -> None:
    """Load :func:`save_student`'s file into an explorer's student copy."""
    from safetensors.torch import load_model

    if not path.is_file():
        raise FileNotFoundError(f"the weights the explorer's student copy held, {path}, are missing")
    load_model(student, str(path))
