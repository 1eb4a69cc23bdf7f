"""A tenant's storage budget: the bytes of params and results it may write in any hour.

Each accepted write counts in a sliding window of ``WINDOW_S`` (one hour): a write of ``n``
bytes at time ``t`` is accepted when the bytes accepted in the hour before it (ending at
``t``, the write itself excluded) plus ``n`` do not exceed the budget (``fits``; a write
that fits exactly is accepted, one byte more is refused). So the bytes accepted in any hour
never exceed the budget.

The window keeps one bucket per whole second: a write at ``t`` counts in the bucket of
``ceil(t)`` and leaves the window at ``ceil(t) + WINDOW_S`` — never before ``t + WINDOW_S``,
so rounding only ever counts a write a little longer, never shorter. A window holds at most
``WINDOW_S`` buckets however many writes it counts.

A refused write learns when it would fit (``StorageWindow.wait``): when enough of the
oldest buckets have left the window; never (``math.inf``) for a write larger than the whole
budget. The processor keeps one window per tenant (``StorageBudgets``) and is the one place
that decides (docs/design.md §9, "Storage budget"). Pure: no I/O, no clock — time enters as
seconds ``now``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from chronolog.domain import messages as m

__all__ = ["SETTING", "WINDOW_S", "StorageBudgets", "StorageWindow", "fits", "params_bytes",
           "refusal_reason", "result_bytes", "retry_after"]

WINDOW_S = 3600  # the budget's window: any hour
SETTING = "storage_budget"  # the tenants-file setting (and the ``field`` of a refusal)


def fits(used: int, size: int, budget: int) -> bool:
    """The storage budget's rule: a write of ``size`` bytes fits when ``used`` (the bytes
    accepted in the hour before it) plus ``size`` do not exceed ``budget``."""
    return used + size <= budget


@dataclass
class StorageWindow:
    """The bytes one tenant wrote in the last hour, by the second they leave it."""

    buckets: deque[list[int]] = field(default_factory=deque)  # [second, bytes], oldest first
    used: int = 0

    def _expire(self, now: float) -> None:
        while self.buckets and self.buckets[0][0] + WINDOW_S <= now:
            self.used -= self.buckets.popleft()[1]

    def wait(self, size: int, budget: int, now: float) -> float | None:
        """None: a write of ``size`` bytes fits at ``now``; else the seconds until it would
        (``math.inf``: never, it is larger than the budget)."""
        self._expire(now)
        if fits(self.used, size, budget):
            return None
        if size > budget:
            return math.inf
        left = self.used
        for second, count in self.buckets:
            left -= count
            if fits(left, size, budget):
                return second + WINDOW_S - now
        raise AssertionError("an empty window fits any write within the budget")

    def take(self, size: int, now: float) -> None:
        """Count an accepted write of ``size`` bytes at ``now``."""
        self._expire(now)
        second = math.ceil(now)
        if self.buckets and self.buckets[-1][0] >= second:
            self.buckets[-1][1] += size  # same second (or a clock that stepped back): later
        else:
            self.buckets.append([second, size])
        self.used += size


@dataclass
class StorageBudgets:
    """One ``StorageWindow`` per tenant (a processor's, over the partitions it owns)."""

    windows: dict[str, StorageWindow] = field(default_factory=dict)

    def wait(self, tenant: str, size: int, budget: int, now: float) -> float | None:
        """As ``StorageWindow.wait``, for ``tenant``'s window."""
        window = self.windows.get(tenant)
        if window is None:
            return None if fits(0, size, budget) else math.inf
        return window.wait(size, budget, now)

    def take(self, tenant: str, size: int, now: float) -> None:
        self.windows.setdefault(tenant, StorageWindow()).take(size, now)


def params_bytes(payload: m.Command) -> int:
    """The bytes of params a command writes (JSON): a create's or revise's job params, a
    manual trigger's params; 0 for any other command."""
    params: dict[str, Any] | None = None
    if isinstance(payload, m.CreateSchedule | m.ReviseSchedule):
        params = payload.spec.job.params
    elif isinstance(payload, m.TriggerRun):
        params = payload.params
    return len(orjson.dumps(params)) if params else 0


def result_bytes(size: int, inline: Any) -> int:
    """The bytes a result writes: the size its outcome declares, or its inline JSON when
    that is larger (a worker cannot shrink an inline result by declaring less)."""
    return max(size, len(orjson.dumps(inline)) if inline is not None else 0)


def refusal_reason(tenant: str, what: str, size: int, budget: int, wait: float) -> str:
    """The one line a refused write is told (HTTP 429, the CLI's stderr, a failed attempt)."""
    head = (f"over the storage budget of tenant '{tenant}' ({SETTING} = {budget} bytes an "
            f"hour): {what}, {size} bytes")
    if math.isinf(wait):
        return f"{head}, is larger than the whole budget"
    return f"{head}, does not fit this hour; retry in {retry_after(wait)}s"


def retry_after(wait: float) -> int:
    """Whole seconds to wait (at least 1), as ``Retry-After`` says it."""
    return max(1, math.ceil(wait))
