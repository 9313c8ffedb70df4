"""The keys the framework plug-ins take, with their defaults and meanings: Trinity-RFT's
``algorithm.sample_strategy_args`` and verl's ``trainer.v1.sampler.sampler_kwargs``. The plug-ins validate against
these tables and the config reference page is generated from them (no framework is imported here)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from divopd.integrations.plugin_run import DEFAULTS as PLUGIN_DEFAULTS
from divopd.sampling import SamplerConfig
from divopd.sampling.settings import SAMPLER_SETTINGS

__all__ = ["KEY_MEANINGS", "TRINITY_ARGS", "VERL_KWARGS", "plugin_key_reference"]

#: ``algorithm.sample_strategy_args`` (Trinity-RFT) and their defaults: the paper's values.
TRINITY_ARGS: dict[str, Any] = {"method": "divopd", "batch_size": None,
                                **{f.name: f.default for f in fields(SamplerConfig) if f.name not in ("method",
                                                                                                     "batch_size")},
                                **PLUGIN_DEFAULTS}

#: ``trainer.v1.sampler.sampler_kwargs`` (verl) and their defaults (``max_staleness`` None: from verl's
#: ``max_off_policy_threshold`` − 1, else 2).
VERL_KWARGS: dict[str, Any] = {
    "method": "divopd", "batch_size": None, "pool_factor": 4, "cap": 4, "max_staleness": None, "max_pending": None,
    "max_pending_age": 8, "cap_unit": "turns", "group_order": "first-seen", "seed": 0, "sample_timeout_s": 3600.0,
    **PLUGIN_DEFAULTS, "dispatch": "matched",
}

#: What each key that is not one of the sampler's settings means.
KEY_MEANINGS: dict[str, str] = {
    "method": "The selection rule (`divopd`, `divopd-base`, `vanilla`, ...): a sampler rule name.",
    "batch_size": "B, rows per update; none = the framework's (Trinity `buffer.train_batch_size`; verl the rows "
                  "it asks for, which a given value must equal).",
    "seed": "Seeds the uniform within-rollout order of the rules that use one.",
    "max_staleness": "δ: turns with learner − policy version above this expire (verl: none = "
                     "`max_off_policy_threshold` − 1, else 2).",
    "target_arrival_ratio": "ρ*: turns generated and teacher-scored per trained turn that the dispatch aims at.",
    "horizon": "The env's step limit, for the start value of turns per session (half of it); none = from the "
               "task rows (verl), else 30.",
    "experience_dir": "A directory that receives divopd's experience log of every turn the plug-in received "
                      "(`divopd replay DIR`, `divopd tune-cap DIR`); none = no log. A fresh run refuses one that "
                      "holds an earlier run's log; a run the framework resumes continues its own, cut back to the "
                      "checkpoint.",
    "sample_timeout_s": "Seconds a step waits for enough valid, fresh turns before one error line.",
    "dispatch": "`matched`: the buffer starts ρ*·B / (turns per session) sessions a step through divopd's agent-loop "
                "manager; `verl`: verl's own per-step dispatch (the buffer only measures).",
}


def plugin_key_reference(defaults: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """``(key, default, meaning)`` of every key in a plug-in's ``defaults`` table, in its order."""
    settings = {s.name: s.description for s in SAMPLER_SETTINGS}
    rows = []
    for key, default in defaults.items():
        meaning = KEY_MEANINGS.get(key) or settings.get(key)
        if meaning is None:
            raise KeyError(f"plug-in key {key!r} has no meaning in KEY_MEANINGS or SAMPLER_SETTINGS")
        rows.append((key, default, meaning))
    return rows
