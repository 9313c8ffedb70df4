"""The bounds of the offline WebShop server: what one request, one connection and the open sessions may take. The
defaults leave a training run's sessions alone: a rollout touches its session every turn."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ServerLimits", "SessionClock"]


@dataclass(frozen=True)
class ServerLimits:
    """Bounds of one :class:`~divopd.explore.envs.webshop_offline.server.WebShopServer` (all must be > 0)."""

    max_body_bytes: int = 1 << 20
    """The largest request body read (bytes); a larger ``Content-Length`` gets ``413`` without being read."""
    timeout_s: float = 60.0
    """How long a connection may stay silent mid-request or between keep-alive requests before it is closed."""
    session_ttl_s: float = 3600.0
    """A session unused for this long is dropped (its ``env_idx`` then answers ``404``: an environment error)."""
    max_sessions: int = 1024
    """The most open sessions; ``POST /create`` beyond it gets ``503`` until one closes or expires."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "timeout_s", "session_ttl_s", "max_sessions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"webshop server limit {name} must be a positive number, got {value!r}")


@dataclass
class SessionClock:
    """When each open session was last used; :meth:`expired` names the ones idle past the TTL."""

    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    last_used: dict[int, float] = field(default_factory=dict)

    def touch(self, idx: Any) -> None:
        if isinstance(idx, int) and not isinstance(idx, bool):
            self.last_used[idx] = self.clock()

    def forget(self, idx: Any) -> None:
        self.last_used.pop(idx, None)

    def expired(self) -> list[int]:
        """The sessions idle longer than the TTL (forgotten here; the caller drops them)."""
        now = self.clock()
        old = [idx for idx, t in self.last_used.items() if now - t > self.ttl_s]
        for idx in old:
            del self.last_used[idx]
        return old
