"""Per-turn OPD workflows for Trinity-RFT, registered in Trinity's ``WORKFLOWS`` from divopd's plug-in directory: play a
divopd environment turn by turn, one teacher-scored ``Experience`` per student turn.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from importlib import resources
from typing import Any

import torch
import yaml
from trinity.common.experience import EID, Experience
from trinity.common.workflows import WORKFLOWS, Task, Workflow

from divopd.explore.envs import make_env
from divopd.explore.prompting import build_messages, encode_prompt
from divopd.explore.recovery import RecoveryState
from divopd.explore.settings import ExplorerConfig
from divopd.integrations.trinity_records import TURN_VERSION_KEY, UNSCORED_KEY
from divopd.integrations.trinity_tasks import read_row

__all__ = ["WORKFLOW_NAMES", "DivOPDWorkflow", "workflow_settings"]

#: Trinity registry name -> packaged setting whose explorer section gives the defaults (None: the row only).
WORKFLOW_NAMES: dict[str, str | None] = {
    "divopd_opd_workflow": None,
    "divopd_alfworld_workflow": "alfworld",
    "divopd_scienceworld_workflow": "scienceworld",
    "divopd_webshop_workflow": "webshop",
}
_ROW_EXPLORER = ("env", "env_kwargs", "max_steps")


@lru_cache(maxsize=8)
def _setting_explorer(setting: str) -> dict[str, Any]:
    text = resources.files("divopd").joinpath("configs", f"{setting}.yaml").read_text()
    return dict(yaml.safe_load(text)["explorer"])


def workflow_settings(setting: str | None, row: dict[str, Any], workflow_args: dict[str, Any]) -> tuple[
        ExplorerConfig, str]:
    """The explorer settings of one task and its task id: the packaged ``setting``'s explorer section (if any), then
    the row's ``env``/``env_kwargs``/``max_steps``/``explorer``, then ``workflow_args`` (same keys)."""
    merged: dict[str, Any] = dict(_setting_explorer(setting)) if setting else {}
    for source in (row, workflow_args):
        merged.update({k: source[k] for k in _ROW_EXPLORER if k in source})
        merged.update(source.get("explorer") or {})
    config = ExplorerConfig.model_validate({k: v for k, v in merged.items() if k in ExplorerConfig.model_fields})
    task = workflow_args.get("task", row.get("task"))
    if task is None:
        raise ValueError("divopd workflow: the task row has no 'task' (write task files with divopd tasks)")
    return config, str(task)


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _prompt_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt as Trinity's engines render a chat (template, generation prompt), plain without a template."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


class DivOPDWorkflow(Workflow):
    """One rollout of a divopd environment, one ``Experience`` per student turn: the rollout model generates each
    action, the first auxiliary model (the teacher) scores the turn's tokens (never NaN), and
    ``info["divopd_policy_version"]`` keeps the version read before the turn's generate call. With +R the teacher
    takes over after stalled turns (not emitted)."""

    is_async: bool = True
    can_reset: bool = False
    can_repeat: bool = False
    #: packaged setting whose explorer section gives the defaults (the named entries set it)
    setting: str | None = None

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        # the teacher is used through its ModelWrapper only: no OpenAI client (Trinity's base class would ask the
        # auxiliary engine for an API server, which the teacher then needs only for this)
        super().__init__(task=task, model=model, auxiliary_models=None)
        self.auxiliary_model_wrappers = auxiliary_models
        if not auxiliary_models:
            raise ValueError("divopd workflows need the teacher as explorer.auxiliary_models[0] (on-policy "
                             "distillation scores every turn with it)")
        self.teacher = auxiliary_models[0]
        self.row = read_row(task.raw_task or {})
        self.config, self.task_id = workflow_settings(self.setting, self.row, dict(task.workflow_args or {}))

    async def run_async(self) -> list[Experience]:
        cfg = self.config
        tokenizer = _tokenizer(self.model.model_path)
        env = await asyncio.to_thread(make_env, cfg.env, **cfg.env_kwargs)
        try:
            return await self._play(env, tokenizer)
        finally:
            await asyncio.to_thread(env.close)

    async def _play(self, env: Any, tokenizer: Any) -> list[Experience]:
        cfg = self.config
        first = await asyncio.to_thread(env.reset, self.task_id)
        history: list[tuple[str, str]] = []
        valid = env.valid_actions()
        recovery = RecoveryState()
        recovery.start(env.allowed_actions_key(), first)
        experiences: list[Experience] = []
        success, score, steps = False, 0.0, 0
        while steps < cfg.max_steps:
            version = int(await self.model.model_version_async)
            actor = recovery.next_actor(version, cfg.recovery)
            encoded = encode_prompt(tokenizer, cfg.prompt, first, history, valid)
            kept = history[len(history) - encoded.history_kept:] if encoded.history_kept else []
            text = _prompt_text(tokenizer, build_messages(cfg.prompt, first, kept, valid))
            model = self.teacher if actor == "teacher" else self.model
            greedy = cfg.recovery.teacher_greedy if actor == "teacher" else cfg.generation.greedy
            turn = (await model.generate_async([text], **self._sampling(greedy)))[0]
            action = _first_line(turn.response_text)
            if actor == "student":
                experiences.append(await self._score(turn, steps, version, encoded.truncated))
            obs, reward, done, info = await asyncio.to_thread(env.step, action)
            steps += 1
            success, score = bool(info.get("success", False)), float(info.get("score", 0.0))
            if actor == "student":
                experiences[-1].reward = float(reward)
                experiences[-1].info.update({"action": action, "score": score})
            recovery.step(actor, action, bool(info.get("invalid", False)), env.allowed_actions_key(), obs,
                          cfg.recovery)
            history.append((action, obs))
            valid = env.valid_actions()
            if done:
                break
        for exp in experiences:  # the outcome is known once the rollout ended
            exp.info.update({"success": success, "rollout_score": score, "horizon": steps,
                             "teacher_turns": recovery.teacher_turns})
            exp.metrics = {"divopd/success": float(success), "divopd/horizon": float(steps)}
        return experiences

    def _sampling(self, greedy: bool) -> dict[str, Any]:
        gen = self.config.generation
        args: dict[str, Any] = {"n": 1, "logprobs": 0, "max_tokens": gen.max_new_tokens,
                                "temperature": 0.0 if greedy else gen.temperature}
        if gen.stop_on_newline:
            args["stop"] = ["\n"]
        return args

    async def _score(self, turn: Experience, step: int, version: int, truncated: bool) -> Experience:
        """The turn's experience with the teacher's log probs of its response tokens (never NaN)."""
        tokens = torch.as_tensor(turn.tokens).long()
        p = int(turn.prompt_length)
        n = len(tokens) - p
        student = torch.as_tensor(turn.logprobs, dtype=torch.float32).reshape(-1)[:n]
        mask = torch.ones(n, dtype=torch.bool)
        info: dict[str, Any] = {"task": self.task_id, "env": self.config.env, TURN_VERSION_KEY: version}
        try:
            scored = await self.teacher.logprobs_async(tokens=tokens.tolist(), temperature=1.0)
            teacher = torch.as_tensor(scored, dtype=torch.float32).reshape(-1)[p - 1:p - 1 + n]
            if len(teacher) != n:
                raise ValueError(f"{len(teacher)} teacher log probs for {n} response tokens")
        except Exception:  # an unscored turn: kept and counted by the gate (missing_teacher), never NaN
            teacher, info[UNSCORED_KEY] = student.clone(), True
            mask[:] = False
        bad = ~torch.isfinite(teacher)
        if bool(bad.any()):  # positions the teacher could not score: out of the mask, finite placeholder
            teacher = torch.where(bad, torch.where(torch.isfinite(student), student, 0.0), teacher)
            mask &= ~bad
            info["teacher_masked_tokens"] = int(bad.sum())
        if truncated:  # the teacher never saw the real context: a dead row (the gate rejects it: prompt_truncated)
            mask[:] = False
        return Experience(
            eid=EID(step=step), tokens=tokens, prompt_length=p, logprobs=student, teacher_logprobs=teacher,
            action_mask=mask, reward=0.0, truncate_status="prompt_truncated" if truncated else turn.truncate_status,
            prompt_text=turn.prompt_text, response_text=turn.response_text, info=info)


def _named(name: str, setting: str | None) -> type[DivOPDWorkflow]:
    if setting is None:
        return DivOPDWorkflow
    cls_name = "DivOPD" + "".join(part.capitalize() for part in setting.split("-")) + "Workflow"
    cls = type(cls_name, (DivOPDWorkflow,), {"setting": setting, "__module__": __name__, "__qualname__": cls_name,
                                             "__doc__": f"``{name}``: divopd's {setting} setting as defaults."})
    globals()[cls_name] = cls  # importable by name: Ray pickles a task's workflow class by reference
    return cls


for _name, _setting in WORKFLOW_NAMES.items():
    if _name not in WORKFLOWS.modules:  # a plug-in directory may load this module a second time
        WORKFLOWS.register_module(_name, module_cls=_named(_name, _setting))
