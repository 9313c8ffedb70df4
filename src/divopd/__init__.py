"""DivOPD: batch selection for asynchronous on-policy distillation of multi-turn LLM agents.

Explorers run a student LM in text environments, a frozen teacher scores every response token, and each student turn
enters a queue as a :class:`Turn`. The learner takes one optimizer step per batch of B turns; DivOPD changes which turns
enter the batch (:mod:`divopd.sampling`). This top-level package imports no torch.
"""

from divopd import gate
from divopd.experience import Turn

__version__ = "0.1.0"
__all__ = ["Turn", "gate", "__version__"]
