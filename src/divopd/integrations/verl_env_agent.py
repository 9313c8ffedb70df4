"""``divopd_env_agent``: a verl 0.9.1 agent loop that plays a multi-turn divopd environment, one output per turn.

Each turn's prompt is built as divopd's explorer builds it (:func:`divopd.explore.prompting.encode_prompt`), and its
output carries the weights version of *that turn's* generate call (``min_global_steps``), ``turn_index`` and
``prompt_truncated``; the episode's score is the last output's ``reward_score``. The task is the row
``divopd tasks CONFIG --for verl`` writes into ``extra_info.divopd_task`` (:mod:`divopd.integrations.verl_tasks`).
Importing this module registers the loop (divopd's agent-loop manager does). +R is not played: verl's teacher scores.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from divopd.errors import UsageError
from divopd.explore.envs import make_env
from divopd.explore.prompting import PromptConfig, decode_action, encode_prompt
from divopd.integrations.verl_tasks import AGENT_NAME

__all__ = ["AGENT_NAME", "DivOPDEnvAgentLoop", "task_row"]

def task_row(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The divopd task row of a dataset row's fields (``extra_info.divopd_task``, JSON text or a dict)."""
    extra = kwargs.get("extra_info") or {}
    raw = extra.get("divopd_task") if hasattr(extra, "get") else None
    if raw is None:
        raise UsageError(f"{AGENT_NAME}: the dataset row has no extra_info.divopd_task: make the data files with "
                         "`divopd tasks CONFIG --for verl --split train --out FILE.parquet`")
    row = json.loads(raw) if isinstance(raw, str) else dict(raw)
    missing = [k for k in ("env", "task", "max_steps") if k not in row]
    if missing:
        raise UsageError(f"{AGENT_NAME}: extra_info.divopd_task has no {missing[0]!r}")
    return row


@register(AGENT_NAME)
class DivOPDEnvAgentLoop(AgentLoopBase):
    """Plays one divopd environment episode per session; returns one :class:`AgentLoopOutput` per assistant turn."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:  # type: ignore[override]
        row = task_row(kwargs)
        explorer = row.get("explorer") or {}
        prompt_cfg = PromptConfig(**(explorer.get("prompt") or {}))
        budget = min(prompt_cfg.max_prompt_tokens, int(self.rollout_config.prompt_length))
        prompt_cfg = prompt_cfg.model_copy(update={"max_prompt_tokens": budget})
        response_length = int(self.rollout_config.response_length)
        max_new = (explorer.get("generation") or {}).get("max_new_tokens")
        params = {**sampling_params, "max_tokens": min(int(max_new), response_length) if max_new else response_length}
        loop = asyncio.get_running_loop()
        env = make_env(row["env"], **(row.get("env_kwargs") or {}))
        outputs: list[AgentLoopOutput] = []
        score = 0.0
        try:
            first = await loop.run_in_executor(None, env.reset, str(row["task"]))
            history: list[tuple[str, str]] = []
            for turn_index in range(int(row["max_steps"])):
                prompt = encode_prompt(self.tokenizer, prompt_cfg, first, history, env.valid_actions())
                out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=list(prompt.ids),
                                                         sampling_params=params)
                response = list(out.token_ids)[:response_length]
                logprobs = list(out.log_probs)[:len(response)] if out.log_probs else None
                action = decode_action(self.tokenizer, response)
                observation, reward, done, _info = await loop.run_in_executor(None, env.step, action)
                score += float(reward)
                outputs.append(AgentLoopOutput(
                    prompt_ids=list(prompt.ids), response_ids=response, response_mask=[1] * len(response),
                    response_logprobs=logprobs, num_turns=2, metrics=AgentLoopMetrics(),
                    extra_fields={
                        "min_global_steps": out.extra_fields.get("min_global_steps"),
                        "max_global_steps": out.extra_fields.get("max_global_steps"),
                        "turn_index": turn_index, "prompt_truncated": bool(prompt.truncated),
                        "env": str(row["env"]), "task": str(row["task"]), "reward_extra_info": {}}))
                history.append((action, observation))
                if done:
                    break
        finally:
            env.close()
        if outputs:
            outputs[-1].reward_score = score
        return outputs
