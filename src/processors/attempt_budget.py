"""A tenant's budget of retries per minute: a token bucket per tenant, in the processor.

``max_attempts_per_minute = N`` (tenants file) lets the tenant's failed runs schedule N
retries in a burst, refilled at N a minute. A retry over the budget is not dropped: it is
delayed until the bucket has a token for it — the delay is handed to the decider as data
(``TenantContext.retry_delay``) and so lands in the ``RetryScheduled`` event's ``retry_at``
(replay never recomputes it). Each retry scheduled takes its token even when the bucket is
empty (the count goes below zero), so the delays of successive retries over the budget grow:
N a minute is the most that are scheduled to start, however many runs fail.

In memory, per processor: the budget holds per node over the partitions it owns (after a
restart or a partition move it starts full).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # seconds (authority time) of the last refill


class AttemptBudget:
    """Token buckets of retries, one per tenant with a ceiling."""

    def __init__(self) -> None:
        self._buckets: dict[str, _Bucket] = {}

    def _refilled(self, tenant: str, per_minute: int, now: float) -> _Bucket:
        b = self._buckets.get(tenant)
        if b is None:
            b = self._buckets[tenant] = _Bucket(float(per_minute), now)
        elif now > b.at:
            b.tokens = min(float(per_minute), b.tokens + (now - b.at) * per_minute / 60.0)
            b.at = now
        return b

    def delay(self, tenant: str, per_minute: int, now: float) -> float:
        """Seconds until the tenant's next retry has a token (0: one is there now)."""
        b = self._refilled(tenant, per_minute, now)
        return 0.0 if b.tokens >= 1 else (1 - b.tokens) * 60.0 / per_minute

    def take(self, tenant: str, per_minute: int, now: float) -> None:
        """A retry was scheduled: it takes a token (the count may go below zero)."""
        self._refilled(tenant, per_minute, now).tokens -= 1
