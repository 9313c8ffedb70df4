"""Try divopd's verl agent loop on a CPU (``examples/try_verl.py``, ``benchmarks/bench_dispatch.py``): verl's real TQ
worker plays a divopd env, HF models (:class:`HFServer`) standing in for verl's vLLM servers and one in-process server
for its load balancer (:func:`server_client`). Needs the verl venv.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["HFServer", "play_prompts", "server_client", "verl_config", "worker"]


class HFServer:
    """What verl's vLLM server returns, from an HF model (``version``: the weights version it reports)."""

    def __init__(self, path: str, unscored_every: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        self.version = 0
        self.calls = 0
        self.unscored_every = unscored_every  # as teacher: every this many calls, the last position unscored (NaN)
        # ``await server.generate.remote(...)``: a coroutine is awaitable like an ObjectRef
        self.generate = SimpleNamespace(remote=self._generate)

    def weights_version(self) -> int:
        """The weights version the server reports with each sampled response."""
        return self.version

    async def _generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **_: Any) -> Any:
        import torch
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        ids = torch.tensor([prompt_ids])
        if "prompt_logprobs" in sampling_params:  # the teacher: vLLM's prompt log probs, K = 1
            with torch.no_grad():
                logp = torch.log_softmax(self.model(ids).logits[0, :-1].float(), dim=-1)
            rows = logp.gather(-1, ids[0, 1:, None])[:, 0].tolist()
            if self.unscored_every and self.calls % self.unscored_every == 0:
                rows[-1] = float("nan")  # the last response token: a position the teacher could not score
            return TokenOutput(token_ids=[0], extra_fields={
                "prompt_ids": [[t] for t in prompt_ids[1:]] + [[0]], "prompt_logprobs": [[v] for v in rows] + [[0.0]]})
        torch.manual_seed(self.calls)
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=int(sampling_params["max_tokens"]), do_sample=True,
                                      output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        response = out.sequences[0, ids.shape[1]:]
        logits = torch.stack(out.logits, dim=1)[0].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, response[:, None])[:, 0]
        return TokenOutput(token_ids=response.tolist(), log_probs=logprobs.tolist(),
                           extra_fields={"global_steps": self.weights_version()})


def server_client(config: Any, server: HFServer) -> Any:
    """verl's ``LLMServerClient`` with its load balancer replaced by one in-process server."""
    from verl.workers.rollout.llm_server import LLMServerClient

    class _Client(LLMServerClient):
        async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
            return "hf-0", server

        def _release_server(self, server_id: str, request_id: str | None = None) -> None:
            return None

    return _Client(config, load_balancer_handle=None)


def verl_config(models: dict[str, str], max_new_tokens: int, rollout_n: int = 1) -> Any:
    """verl's ``ppo_trainer`` config (Hydra) with distillation on and these models."""
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={models['student']}", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.rollout.prompt_length=4096",
            f"actor_rollout_ref.rollout.response_length={max_new_tokens}", f"actor_rollout_ref.rollout.n={rollout_n}",
            "distillation.enabled=true", "distillation.distillation_loss.loss_mode=k3",
            f"distillation.teacher_models.teacher_model.model_path={models['teacher']}"])


def worker(models: dict[str, str], max_new_tokens: int) -> tuple[Any, HFServer, HFServer]:
    """verl's TQ agent-loop worker under divopd's override, with the student and teacher stand-in servers."""
    from divopd.integrations.verl_agent_loop import _DivOPDWorker

    config = verl_config(models, max_new_tokens)
    student, teacher = HFServer(models["student"]), HFServer(models["teacher"])
    return (_DivOPDWorker(config, llm_client=server_client(config, student),
                          teacher_client={"default": server_client(config, teacher)}), student, teacher)


def play_prompts(agent_worker: Any, prompts: list[dict[str, Any]], step: int = 1) -> None:
    """Play ``prompts`` (``{"uid": ..., "row": divopd task row}``) to the end through the worker's ``_run_prompt``, as
    verl's worker does for each prompt of a batch (one session each)."""
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}

    async def play() -> None:
        await asyncio.gather(*[agent_worker._run_prompt(
            {"uid": p["uid"], "agent_name": "divopd_env_agent", "raw_prompt": [{"role": "user", "content": "-"}],
             "extra_info": {"index": i, "divopd_task": json.dumps(p["row"])}, "index": i, "global_steps": step},
            dict(sampling), {"step": step, "sample_index": i, "rollout_n": 0, "validate": False})
            for i, p in enumerate(prompts)])

    asyncio.run(play())
