"""An import-only stand-in for ``vllm`` (tests only). Trinity-RFT 0.6.0's ``trinity.common.models.model`` (its
``ModelWrapper``, hence its ``WorkflowRunner``) imports vLLM's multimodal helpers at import time, and vLLM's GPU
build cannot be installed beside Trinity on this CPU machine. Every name here is a placeholder that fails if called:
the tests' text-only paths never call them (a call would raise, not pass silently)."""

import sys
import types


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"vllm stand-in: {self._name} is not available in the CPU tests")

    def __getattr__(self, attr: str):
        return _Placeholder(f"{self._name}.{attr}")

    def __getitem__(self, item):
        return self


class _Module(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


for _name in ("vllm.config", "vllm.inputs", "vllm.entrypoints", "vllm.entrypoints.chat_utils", "vllm.sampling_params",
              "vllm.lora", "vllm.lora.request", "vllm.outputs", "vllm.multimodal", "vllm.transformers_utils"):
    sys.modules.setdefault(_name, _Module(_name))
sys.modules[__name__].__class__ = _Module
__version__ = "0.0.0-stand-in"
