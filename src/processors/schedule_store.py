"""A partition's schedule states, the idle ones kept as their snapshot bytes (hot and cold).

Most schedules of a partition are idle most of the time: their next instant is hours or
days away, they have no open run, no pending work and wait for no quota slot. Held as live
``ScheduleState`` objects they cost about 1.8 KB each; held as the bytes the snapshot codec
(``chronolog.commands.state_codec``) gives them, about 300. This store holds both:

* *hot* states as objects — every state that may change soon, and every state just read;
* *cold* states as their encoded bytes, with the minute of their wake-up in a bucket, so that
  a periodic ``warm(now)`` brings back, ahead of their instant, exactly the schedules whose
  wake-up comes within the horizon: it pops whole buckets, it never scans the cold keys.

``get`` hydrates a cold state (a command for that key sees exactly the state it would have
seen: the codec's round trip is exact). ``cool(now)`` turns the idle hot states cold.

A bucket entry is not removed when its key is hydrated or cooled again later: a stale entry
only warms a state early, which is harmless (a warm state is merely hot). So a cold state is
never late as long as ``warm`` runs at least once per horizon less a minute — the caller's
sweep runs far more often. Nothing here arms timers: ``cool`` and ``warm`` say which keys
left or joined the hot set, and the caller disarms or arms them.

Pure: no I/O; the clock is the caller's ``now``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from chronolog.commands.state import Policy, QuotaWait, ScheduleState
from chronolog.commands.state_codec import (
    decode_schedule,
    decode_shape,
    encode_schedule,
    shape_of,
)
from chronolog.domain.codec import kept

__all__ = ["ScheduleStore", "is_idle", "wake_minute"]

Wakeup = Callable[[ScheduleState], datetime | None]


def wake_minute(wake: datetime) -> int:
    """The bucket of a wake-up: its minute since the epoch (rounded down)."""
    return int(wake.timestamp()) // 60


def is_idle(st: ScheduleState, wake: datetime | None, now: datetime,
            horizon: timedelta) -> bool:
    """Whether a state may be held cold: nothing of it can change before ``now + horizon``
    unless a command arrives — no open run, no pending work, no quota wait, not a draft,
    and no wake-up within the horizon (``None``: it has none, e.g. paused)."""
    if st.owned is not None or st.runs or st.pending or isinstance(st.quota, QuotaWait):
        return False
    return wake is None or wake > now + horizon


class ScheduleStore:
    """key -> ``ScheduleState`` of a partition; idle states held as their encoded bytes."""

    def __init__(self, horizon: timedelta | None, wakeup: Wakeup) -> None:
        # None: nothing is ever held cold (every state stays an object)
        self.horizon = horizon
        self._wakeup = wakeup
        self._hot: dict[str, ScheduleState] = {}
        self._cold: dict[str, bytes] = {}
        # minute -> keys whose wake-up fell in it when cooled (entries may be stale)
        self._buckets: dict[int, list[str]] = {}
        self._minutes: list[int] = []  # heap of the buckets' minutes
        # shape hash -> its validated policy, to decode the cold states
        self._shapes: dict[str, Policy] = {}

    # ---------------------------------------------------------------- a dict of states

    def __contains__(self, key: object) -> bool:
        return key in self._hot or key in self._cold

    def __len__(self) -> int:
        return len(self._hot) + len(self._cold)

    def __iter__(self) -> Iterator[str]:
        yield from self._hot
        yield from self._cold

    def get(self, key: str) -> ScheduleState | None:
        """The live state of ``key`` (a cold one is hydrated and stays hot)."""
        st = self._hot.get(key)
        if st is not None:
            return st
        data = self._cold.pop(key, None)
        if data is None:
            return None
        st = decode_schedule(data, self._shapes)
        self._hot[key] = st
        return st

    def __getitem__(self, key: str) -> ScheduleState:
        st = self.get(key)
        if st is None:
            raise KeyError(key)
        return st

    def put(self, key: str, st: ScheduleState) -> None:
        """Hold ``st`` as the hot state of ``key``."""
        self._cold.pop(key, None)
        self._hot[key] = st

    def pop(self, key: str) -> ScheduleState | None:
        """Remove ``key``: its state (hydrated when it was cold), or None."""
        st = self.get(key)
        self._hot.pop(key, None)
        return st

    # ---------------------------------------------------------------- hot and cold

    @property
    def hot(self) -> int:
        return len(self._hot)

    @property
    def cold(self) -> int:
        return len(self._cold)

    def is_cold(self, key: str) -> bool:
        return key in self._cold

    def hot_items(self) -> Iterator[tuple[str, ScheduleState]]:
        return iter(list(self._hot.items()))

    def cold_items(self) -> Iterator[tuple[str, bytes]]:
        """(key, encoded state) of the cold states: a snapshot writes these bytes as they
        are."""
        return iter(list(self._cold.items()))

    def shapes(self) -> dict[str, Policy]:
        """Shape hash -> policy of the shapes the cold states name (store them beside)."""
        return dict(self._shapes)

    def add_shape(self, h: str, shape: Policy) -> None:
        """A validated shape (``decode_shape``) the cold states added by ``put_cold`` name."""
        self._shapes.setdefault(h, shape)

    def put_cold(self, key: str, data: bytes, wake: datetime | None) -> None:
        """Hold an encoded state as cold as it is (a restore does not decode it); ``wake``:
        its wake-up, stored beside it. Its shape must be known (``add_shape``)."""
        self._hot.pop(key, None)
        self._cold[key] = kept(data)  # as the caller got them: maybe orjson's 4 KB buffer
        if wake is not None:
            self._bucket(key, wake)

    def cool(self, now: datetime) -> list[str]:
        """Turn every idle hot state cold (``is_idle``); the keys cooled, whose timers the
        caller disarms. Nothing when the horizon is None."""
        horizon = self.horizon
        if horizon is None:
            return []
        cooled: list[str] = []
        for key, st in list(self._hot.items()):
            wake = self._wakeup(st)
            if not is_idle(st, wake, now, horizon):
                continue
            self._cold[key] = self._encode(st)
            del self._hot[key]
            if wake is not None:
                self._bucket(key, wake)
            cooled.append(key)
        return cooled

    def warm(self, now: datetime) -> list[tuple[str, ScheduleState]]:
        """Hydrate the cold states whose wake-up comes within the horizon of ``now`` (every
        one of the buckets up to it); (key, state) of each, whose timer the caller arms."""
        until = wake_minute(now + (self.horizon or timedelta(0)))
        out: list[tuple[str, ScheduleState]] = []
        minutes = self._minutes
        while minutes and minutes[0] <= until:
            for key in self._buckets.pop(heapq.heappop(minutes)):
                if key in self._cold:
                    st = self.get(key)
                    assert st is not None
                    out.append((key, st))
        return out

    # ---------------------------------------------------------------- parts

    def _encode(self, st: ScheduleState) -> bytes:
        pol = st.policy
        if pol is not None:
            h, body = shape_of(pol)
            if h not in self._shapes:
                self._shapes[h] = decode_shape(body)[1]
        return encode_schedule(st)  # of its own size: ``encode_schedule`` uses ``dumps_kept``

    def _bucket(self, key: str, wake: datetime) -> None:
        minute = wake_minute(wake)
        keys = self._buckets.get(minute)
        if keys is None:
            keys = self._buckets[minute] = []
            heapq.heappush(self._minutes, minute)
        keys.append(key)
