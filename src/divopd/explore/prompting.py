"""Chat prompts from a task and its history, encoded under a context budget (:func:`encode_prompt`); the explorer,
the teacher's +R actions and ``divopd sft`` all build them here, so the student sees one format in SFT and in OPD."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_SYSTEM", "EncodedPrompt", "PromptConfig", "build_messages", "decode_action", "encode_action",
           "encode_prompt", "render_ids"]

DEFAULT_SYSTEM = (
    "You are an agent in a text environment. Read the task and the observations, then reply with exactly one "
    "action on a single line, with no explanation."
)


class PromptConfig(BaseModel):
    """How prompts are written and how long they may be."""

    model_config = ConfigDict(extra="forbid")

    system: str = Field(DEFAULT_SYSTEM, description="System message (instructions); empty string = no system message.")
    include_valid_actions: bool = Field(
        True, description="Append the environment's valid actions (where it lists them) to the last observation.")
    max_valid_actions: int = Field(64, ge=1, description="At most this many valid actions are listed.")
    valid_actions_prefix: str = Field("\nValid actions: ", description="Text before the valid-action list.")
    valid_actions_separator: str = Field(", ", description="Separator between listed valid actions.")
    max_prompt_tokens: int = Field(
        1024, ge=8, description="Context budget for the prompt, in tokens (chat template included).")
    history_window: int | None = Field(
        None, ge=0, description="Keep only the last N (action, observation) pairs by design (not flagged); "
        "None = the whole history, subject to the budget.")
    past_observation_max_words: int | None = Field(
        None, ge=1, description="Shorten every observation in the history except the latest to its first N words "
        "(+ ' ...'); the first observation (the task) is kept whole. None = keep them whole. Shorter prompts make "
        "tiny CPU runs several times faster.")
    flag_dropped_history: bool = Field(
        True, description="Flag a prompt as truncated whenever budget pressure drops history (the paper's setting). "
        "False = dropping old history is a window; only prompts whose last observation cannot fit are flagged.")


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt ready for generation: token ids, whether it was truncated, how many history pairs it shows."""

    ids: list[int]
    truncated: bool
    history_kept: int
    history_total: int


def build_messages(config: PromptConfig, first_observation: str, history: Sequence[tuple[str, str]],
                   valid_actions: Sequence[str] | None = None) -> list[dict[str, str]]:
    """Chat messages for one turn: system, the first observation, then the (assistant action, user observation) pairs
    of ``history``; the valid actions go on the last user message."""
    messages: list[dict[str, str]] = []
    if config.system:
        messages.append({"role": "system", "content": config.system})
    messages.append({"role": "user", "content": first_observation})
    limit = config.past_observation_max_words
    for j, (action, observation) in enumerate(history):
        if limit is not None and j < len(history) - 1:
            words = observation.split()
            if len(words) > limit:
                observation = " ".join(words[:limit]) + " ..."
        messages.append({"role": "assistant", "content": action})
        messages.append({"role": "user", "content": observation})
    if config.include_valid_actions and valid_actions:
        listed = config.valid_actions_separator.join(list(valid_actions)[: config.max_valid_actions])
        messages[-1] = {"role": "user", "content": messages[-1]["content"] + config.valid_actions_prefix + listed}
    return messages


def render_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` with the generation prompt, via the tokenizer's chat template (without one: a plain
    ``role: content`` rendering)."""
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(out, "keys"):  # transformers may return a BatchEncoding
            out = out["input_ids"]
        return [int(i) for i in out]
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def encode_prompt(tokenizer: Any, config: PromptConfig, first_observation: str, history: Sequence[tuple[str, str]],
                  valid_actions: Sequence[str] | None = None) -> EncodedPrompt:
    """The next turn's prompt within ``config.max_prompt_tokens`` (paper, validity paragraph): the whole (windowed)
    history if it fits; else the most recent pairs that fit (at least one), flagged ``truncated`` per
    ``config.flag_dropped_history`` (``false``: Appendix E.4's window); else the last ``max_prompt_tokens`` tokens of
    the prompt with one pair, flagged truncated."""
    budget = config.max_prompt_tokens
    history = list(history)
    total = len(history)
    if config.history_window is not None:
        history = history[len(history) - config.history_window:] if config.history_window else []

    def ids_with(k: int) -> list[int]:
        return render_ids(tokenizer, build_messages(config, first_observation, history[len(history) - k:] if k else [],
                                                    valid_actions))

    ids = ids_with(len(history))
    if len(ids) <= budget:
        return EncodedPrompt(ids, False, len(history), total)
    # Largest k in [1, len(history)) whose prompt fits: prompt length grows with k, so binary search.
    lo, hi, best = 1, len(history) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        cand = ids_with(mid)
        if len(cand) <= budget:
            best, lo = (mid, cand), mid + 1
        else:
            hi = mid - 1
    if best is not None:
        return EncodedPrompt(best[1], config.flag_dropped_history, best[0], total)
    # Not even the last pair (or the bare task) fits: keep the most recent tokens.
    ids = ids_with(min(1, len(history)))
    return EncodedPrompt(ids[-budget:], True, min(1, len(history)), total)


def encode_action(tokenizer: Any, action: str) -> list[int]:
    """Response token ids of an action as the student should emit it: the action's tokens, then end-of-sequence."""
    ids = [int(i) for i in tokenizer(action, add_special_tokens=False)["input_ids"]]
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids


def decode_action(tokenizer: Any, response_ids: Sequence[int]) -> str:
    """The action text of a response: decoded without special tokens, first non-empty line, stripped."""
    text = tokenizer.decode(list(response_ids), skip_special_tokens=True)
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
