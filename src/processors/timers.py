"""A partition's timers: each key's next wake instant, earliest first.

A key has at most one armed instant (``armed``); the heap holds (instant, key) entries, and
an entry that no longer matches its key's armed instant is superseded — skipped when it
comes up, or dropped all at once by ``compact`` when most of the heap is such entries (many
keys disarmed at once: schedules turned cold). Pure: the clock is the caller's ``now``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from datetime import datetime

__all__ = ["Timers"]


class Timers:
    """key -> its next wake instant; ``due`` pops those that came, earliest first."""

    def __init__(self) -> None:
        self.armed: dict[str, datetime] = {}
        self._heap: list[tuple[datetime, str]] = []

    def __contains__(self, key: object) -> bool:
        return key in self.armed

    def __len__(self) -> int:
        return len(self.armed)

    def arm(self, key: str, wake: datetime | None) -> None:
        """``key`` wakes at ``wake`` (None: it does not: disarmed)."""
        if wake is None:
            self.armed.pop(key, None)
            return
        if self.armed.get(key) == wake:
            return
        self.armed[key] = wake
        heapq.heappush(self._heap, (wake, key))

    def disarm(self, key: str) -> None:
        self.armed.pop(key, None)

    def due(self, now: datetime, limit: int) -> list[str]:
        """Up to ``limit`` keys whose instant is at or before ``now``, earliest first;
        they are disarmed (the caller's decision arms them again)."""
        out: list[str] = []
        heap, armed = self._heap, self.armed
        while heap and heap[0][0] <= now and len(out) < limit:
            wake, key = heapq.heappop(heap)
            if armed.get(key) != wake:
                continue  # superseded entry
            del armed[key]
            out.append(key)
        return out

    def next(self) -> datetime | None:
        """The earliest armed instant (None: nothing is armed)."""
        heap, armed = self._heap, self.armed
        while heap and armed.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def due_at(self, now: datetime) -> Iterator[str]:
        """The armed keys whose instant is at or before ``now`` (any order; not popped)."""
        return (key for key, wake in self.armed.items() if wake <= now)

    def compact(self) -> None:
        """Drop the superseded entries when they are most of the heap."""
        if len(self._heap) > 2 * len(self.armed) + 1024:
            self._heap = [e for e in self._heap if self.armed.get(e[1]) == e[0]]
            heapq.heapify(self._heap)
