"""The sampler's ledger: where every received turn went, and its metric names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import divopd.sampling.gate as gate

__all__ = ["EXPIRY_REASONS", "Ledger"]

#: Why a turn expired: too old a policy, first seen more than W updates ago, pushed out of a full pending pool.
EXPIRY_REASONS: tuple[str, ...] = ("stale", "pending_age", "pending_overflow")


@dataclass
class Ledger:
    """Counters; ``received == selected + expired + invalid + pending + queued`` always holds. The rejections and
    expiries are also counted by reason (:data:`divopd.sampling.gate.REASONS`, :data:`EXPIRY_REASONS`)."""

    received: int = 0
    selected: int = 0
    expired: int = 0
    invalid: int = 0
    pending: int = 0
    queued: int = 0
    invalid_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(gate.REASONS, 0))
    expired_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EXPIRY_REASONS, 0))

    def as_metrics(self, stats: Mapping[str, float] | None = None) -> dict[str, float]:
        """divopd's metric names: ``sampler/<stat>`` of a batch's ``stats`` (when given), ``ledger/<counter>``,
        ``ledger/invalid/<reason>`` and ``ledger/expired/<reason>``."""
        metrics = {} if stats is None else {f"sampler/{k}": float(v) for k, v in stats.items()}
        for name in ("received", "selected", "expired", "invalid", "pending", "queued"):
            metrics[f"ledger/{name}"] = float(getattr(self, name))
        metrics.update({f"ledger/invalid/{k}": float(v) for k, v in self.invalid_by_reason.items()})
        metrics.update({f"ledger/expired/{k}": float(v) for k, v in self.expired_by_reason.items()})
        return metrics
