"""Batch selection: which queued turns enter a learner batch (the paper's contribution).

Pure Python + numpy, no torch: usable inside any trainer. Typical use::

    from divopd import Turn
    from divopd.sampling import SamplerConfig, make_sampler

    sampler = make_sampler(SamplerConfig("divopd", batch_size=256, pool_factor=4, cap=4, max_staleness=2))
    sampler.add(turns)                       # arrivals from explorers
    batch = sampler.next_batch(learner_version)
    if batch is not None:
        train_on(batch.turns); print(batch.stats, sampler.ledger)
"""

from divopd.sampling.registry import METHODS, ROWS, Method, MethodRow, Switch, get_method, register_method
from divopd.sampling.rows import method_names, method_row
from divopd.sampling.rules import (
    allocate_rollout_first,
    allocate_rollout_first_tokens,
    focus_order,
    is_stale,
    uniform_order,
)
from divopd.sampling.sampler import Batch, Sampler, SamplerConfig, make_sampler
from divopd.sampling.stats import BatchStats, batch_stats, effective_rollouts, ledger_metrics

__all__ = [
    "METHODS",
    "ROWS",
    "MethodRow",
    "Switch",
    "method_names",
    "method_row",
    "Batch",
    "BatchStats",
    "Method",
    "Sampler",
    "SamplerConfig",
    "allocate_rollout_first",
    "allocate_rollout_first_tokens",
    "batch_stats",
    "effective_rollouts",
    "ledger_metrics",
    "focus_order",
    "get_method",
    "is_stale",
    "make_sampler",
    "register_method",
    "uniform_order",
]
