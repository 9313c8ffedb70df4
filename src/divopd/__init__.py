"""DivOPD: batch selection for asynchronous on-policy distillation of multi-turn LLM agents.

Explorers run a student LM in text environments, a frozen teacher scores every response token, and each student turn
enters a queue as a :class:`Turn`. The learner takes one optimizer step per batch of B turns; DivOPD changes which turns
enter the batch (:mod:`divopd.sampling`). This top-level package imports no torch.

Sub-packages follow the data path: ``explore`` → ``experience`` → ``sampling`` → ``learn``, driven by ``train``;
``analysis``, ``commands`` and ``suite`` sit on top; ``models`` at the bottom.
"""

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
