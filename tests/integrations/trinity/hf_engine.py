"""A CPU stand-in for Trinity-RFT's vLLM engine: an ``InferenceModel`` (Trinity's engine interface) backed by an HF
transformers model, run as the named Ray actor Trinity's ``Allocator`` looks up, behind Trinity's real
``ModelWrapper``. Trinity 0.6.0's vLLM engines use a GPU worker class, so its own engines do not run on this CPU."""

from __future__ import annotations

from typing import Any

import torch
from trinity.common.experience import Experience
from trinity.common.models.model import InferenceModel


class HFInferenceModel(InferenceModel):
    """``generate`` (sampled tokens + their log probs, as vLLM's ``logprobs=0``), ``logprobs`` (of every token after
    the first, as Trinity's engines return) and a model version that tests can bump (the weight sync)."""

    def __init__(self, config: Any, path: str) -> None:
        super().__init__(config)
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        torch.set_num_threads(1)
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        self.version = 0
        self.calls = 0

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
        with torch.no_grad():
            logits = self.model(ids).logits[0, :-1].float() / float(temperature or 1.0)
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]

    async def sync_model_weights(self, model_version: int, method: Any = None, timeout: float = 1200) -> int:
        self.version = int(model_version)
        return self.version

    def get_model_version(self) -> int:
        return self.version
