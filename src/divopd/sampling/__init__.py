"""Batch selection: which queued turns enter a learner batch (the paper's contribution). Pure Python + numpy, no
torch: ``make_sampler(SamplerConfig(...))``, ``sampler.add(turns)``, ``sampler.next_batch(learner_version)`` (a
:class:`Batch` or ``None``); the README and docs/concepts/sampler.md show it at work."""

from divopd.sampling.candidate import Candidate, Columns
from divopd.sampling.ledger import Ledger
from divopd.sampling.method_rows import method_names, method_row
from divopd.sampling.registry import METHODS, ROWS, Method, MethodRow, Rule, Switch, get_method, register_method
from divopd.sampling.rules import allocate_rollout_first, focus_order, is_stale, uniform_order, visiting_order
from divopd.sampling.sampler import Batch, Sampler, SamplerConfig, make_sampler
from divopd.sampling.stats import BatchStats, batch_stats, effective_rollouts

__all__ = ["METHODS", "ROWS", "Batch", "BatchStats", "Candidate", "Columns", "Ledger", "Method", "MethodRow", "Rule",
           "Sampler", "SamplerConfig", "Switch", "allocate_rollout_first", "batch_stats", "effective_rollouts",
           "focus_order", "get_method", "is_stale", "make_sampler", "method_names", "method_row", "register_method",
           "uniform_order", "visiting_order"]
