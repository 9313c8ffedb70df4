"""Try divopd's Trinity-RFT workflow on a CPU (``examples/try_trinity.py``, the Trinity tests): Trinity's real
``WorkflowRunner`` plays a divopd env, HF models standing in for Trinity's vLLM engines. Needs the Trinity venv.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

__all__ = ["HFInferenceModel", "engines", "play_tasks", "trinity_config", "vllm_placeholders"]

#: The vLLM modules Trinity-RFT 0.6.0's ``trinity.common.models.model`` imports at import time.
VLLM_MODULES = ("vllm", "vllm.config", "vllm.inputs", "vllm.entrypoints", "vllm.entrypoints.chat_utils",
                "vllm.sampling_params", "vllm.lora", "vllm.lora.request", "vllm.outputs", "vllm.multimodal",
                "vllm.transformers_utils")


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: vLLM is not installed here (divopd's CPU try of Trinity's workflow)")

    def __getattr__(self, attr: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{attr}")

    def __getitem__(self, item: Any) -> _Placeholder:
        return self


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


def vllm_placeholders() -> bool:
    """Where vLLM is not installed, register import-only placeholders for the modules Trinity's ``ModelWrapper``
    imports (a call to any of their names raises); returns whether it did. With vLLM installed it does nothing."""
    if sys.modules.get("vllm") is not None or importlib.util.find_spec("vllm") is not None:
        return isinstance(sys.modules.get("vllm"), _PlaceholderModule)
    for name in VLLM_MODULES:
        sys.modules.setdefault(name, _PlaceholderModule(name))
    sys.modules["vllm"].__version__ = "0.0.0-placeholder"
    return True


vllm_placeholders()

import torch  # noqa: E402
from trinity.common.experience import Experience  # noqa: E402
from trinity.common.models.model import InferenceModel  # noqa: E402


class HFInferenceModel(InferenceModel):
    """Trinity's engine interface from an HF model: ``generate`` (sampled tokens with their log probs, as vLLM's
    ``logprobs=0``), ``logprobs`` (of every token after the first, as Trinity's engines return) and the weights
    version (``sync_model_weights`` sets it, as Trinity's weight sync does)."""

    def __init__(self, config: Any, path: str) -> None:
        super().__init__(config)
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        torch.set_num_threads(1)
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        self.version = 0
        self.calls = 0  # generate calls (the teacher's: +R takeover turns)
        self.scored = 0  # logprobs calls (the teacher's: one per student turn it scores)

    async def generate(self, prompt: str, lora_request: Any = None, **kwargs: Any) -> list[Experience]:
        ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        greedy = float(kwargs.get("temperature") or 1.0) == 0.0
        torch.manual_seed(1000 + self.calls)
        self.calls += 1
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=int(kwargs.get("max_tokens") or 8), do_sample=not greedy,
                                      output_logits=True, return_dict_in_generate=True,
                                      pad_token_id=self.tokenizer.pad_token_id or 0)
        response = out.sequences[0, ids.shape[1]:]
        logits = torch.stack(out.logits, dim=1)[0].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, response[:, None])[:, 0]
        return [Experience(tokens=torch.cat([ids[0], response]).int(), logprobs=logprobs, prompt_length=ids.shape[1],
                           prompt_text=prompt, response_text=self.tokenizer.decode(response, skip_special_tokens=True))]

    async def logprobs(self, token_ids: list[int], lora_request: Any = None, temperature: float | None = None
                       ) -> torch.Tensor:
        ids = torch.tensor([token_ids])
        self.scored += 1
        with torch.no_grad():
            logits = self.model(ids).logits[0, :-1].float() / float(temperature or 1.0)
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]

    async def sync_model_weights(self, model_version: int, method: Any = None, timeout: float = 1200) -> int:
        self.version = int(model_version)
        return self.version

    def get_model_version(self) -> int:
        return self.version


def trinity_config(models: dict[str, str]) -> Any:
    """Trinity's ``Config`` with the student as rollout model and the teacher as auxiliary model 0."""
    from trinity.common.config import Config, InferenceModelConfig

    config = Config()
    config.explorer.rollout_model = InferenceModelConfig(model_path=models["student"])
    config.explorer.auxiliary_models = [InferenceModelConfig(model_path=models["teacher"])]
    return config


def engines(config: Any, models: dict[str, str], pythonpath: str) -> list[Any]:
    """The student's and the teacher's engine as the named Ray actors Trinity's allocator looks up; ``pythonpath``:
    the actors' module path (where divopd and Trinity import from). End them with ``ray.kill``."""
    import ray

    engine = ray.remote(num_cpus=0)(HFInferenceModel)
    env = {"env_vars": {"PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1"}}
    name = config.explorer.name
    return [engine.options(name=f"{name}_{role}_model_0_0", runtime_env=env).remote(model_config, models[key])
            for role, model_config, key in (("rollout", config.explorer.rollout_model, "student"),
                                             ("auxiliary_0", config.explorer.auxiliary_models[0], "teacher"))]


async def play_tasks(config: Any, tasks: list[Any], batch_id: str = "try") -> list[Experience]:
    """Each task through Trinity's ``WorkflowRunner`` (one run each, on the engines :func:`engines` started): their
    experiences, one per student turn. A task the runner reports failed raises ``RuntimeError`` with its message."""
    from trinity.explorer.workflow_runner import WorkflowRunner

    runner = WorkflowRunner(config, rollout_model_id=0, auxiliary_model_ids=[0], runner_id=0)
    experiences: list[Experience] = []
    for i, task in enumerate(tasks):
        task.batch_id, task.task_id = batch_id, i
        status, payload = await runner.run_task(task, batch_id=batch_id, repeat_times=1)
        if not status.ok:
            raise RuntimeError(f"task {i} failed in Trinity's workflow runner: {status.message}")
        experiences += Experience.deserialize_many(payload)
    return experiences
