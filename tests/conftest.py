"""Suite-wide settings that keep verdicts independent of the CPU model and machine load."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# No per-example deadline and no "too slow" health check: both fail on a loaded or slower machine, not on a bug.
settings.register_profile("divopd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("divopd")
