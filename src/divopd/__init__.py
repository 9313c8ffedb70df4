"""DivOPD: batch selection for asynchronous on-policy distillation of multi-turn LLM agents. Explorers queue student
turns (:class:`Turn`) scored by a frozen teacher; DivOPD chooses which enter each learner batch
(:mod:`divopd.sampling`). Sub-packages follow the data path: ``explore`` → ``experience`` → ``sampling`` → ``learn``,
driven by ``train``; ``analysis``, ``commands`` and ``suite`` on top, ``models`` at the bottom. No torch is imported."""

from divopd.experience import Rollout, Turn
from divopd.sampling import gate

__version__ = "0.1.0"
__all__ = ["Rollout", "Turn", "VLLMGenerator", "gate", "__version__"]


def __getattr__(name: str) -> object:
    """``VLLMGenerator`` is imported on first use: importing divopd needs neither torch nor vllm."""
    if name == "VLLMGenerator":
        from divopd.explore.vllm_engine import VLLMGenerator

        return VLLMGenerator
    raise AttributeError(f"module 'divopd' has no attribute {name!r}")
