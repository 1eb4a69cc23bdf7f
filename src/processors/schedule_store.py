"""A partition's schedule states, the idle ones kept as their snapshot bytes (hot and cold).

Most schedules of a partition are idle most of the time: their next instant is hours or
days away, they have no open run, no pending work and wait for no quota slot. Held as live
``ScheduleState`` objects they cost about 1.8 KB each; held as the bytes the snapshot codec
(``chronolog.commands.state_codec``) gives them, about 400. This store holds both:

* *hot* states as objects — every state that may change soon, and every state just read;
* *cold* states as their *sealed* bytes (``seal``: a flag, the wake-up, then the encoded
  state compressed with the embedded log's record dictionary, about half its size — the
  body of a snapshot's schedule record, so a snapshot writes them as they are and a restore
  holds them without decoding), with the minute of their wake-up in a bucket,
  so that ``warm(now)`` brings back, ahead of their instant, exactly the schedules whose
  wake-up comes within the horizon: it pops whole buckets, it never scans the cold keys.

``get`` hydrates a cold state (a command for that key sees exactly the state it would have
seen: the codec's round trip is exact) and marks the key *touched*; ``put`` marks it too.
``cool(now)`` looks at the touched keys alone and turns the idle ones cold: a state can only
become idle by being changed (read through ``get`` first) or put, so nothing else needs
looking at, and a partition of a million states pays for what changed, not for its size.

A bucket entry is not removed when its key is hydrated or cooled again later: a stale entry
only warms a state early, which is harmless (a warm state is merely hot). So a cold state is
never late as long as ``warm`` runs before ``next_warm()`` passes — the partition task's
timers include it. Nothing here arms timers: ``cool`` and ``warm`` say which keys left or
joined the hot set, and the caller disarms or arms them.

Pure: no I/O; the clock is the caller's ``now``.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import orjson
import zstandard

from chronolog.commands.state import Policy, QuotaWait, ScheduleState
from chronolog.commands.state_codec import (
    decode_schedule,
    decode_shape,
    encode_schedule,
    shape_of,
)
from chronolog.domain.codec import kept
from chronolog.log.record_codec import CODEC_ZSTD_DICT_1, pack_many, unpack, unpack_many

__all__ = ["SEAL_SIZE", "ScheduleStore", "is_idle", "is_quiet", "seal", "seal_many", "unseal",
           "unsealed", "wake_minute"]

Wakeup = Callable[[ScheduleState], datetime | None]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_SEAL = struct.Struct(">Bq")  # quiet flag, wake-up in microseconds since the epoch
SEAL_SIZE = _SEAL.size
_NO_WAKE = -(1 << 63)  # the state has no wake-up (paused, finished)
_QUIET = 1
_PACKED = 2  # the encoded state is compressed (``record_codec``, dictionary 1)
_REF = 4  # where an encoded schedule holds its spec: [spec hash, shape hash, params]


def wake_minute(wake: datetime) -> int:
    """The bucket of a wake-up: its minute since the epoch (rounded down)."""
    return int(wake.timestamp()) // 60


def is_quiet(st: ScheduleState) -> bool:
    """Whether nothing of a state can change unless a command arrives or its wake-up comes:
    no open run, no pending work, no quota wait, not a draft (``owned``)."""
    return not (st.owned is not None or st.runs or st.pending
                or isinstance(st.quota, QuotaWait))


def is_idle(st: ScheduleState, wake: datetime | None, now: datetime,
            horizon: timedelta) -> bool:
    """Whether a state may be held cold: quiet (``is_quiet``) and no wake-up within the
    horizon (``None``: it has none, e.g. paused)."""
    return is_quiet(st) and (wake is None or wake > now + horizon)


def seal(st: ScheduleState, wake: datetime | None) -> bytes:
    """A state's sealed bytes: whether it is quiet, its wake-up, its encoded state
    (``encode_schedule``) compressed. A snapshot stores them; ``unseal`` reads the first two
    back, ``unsealed`` the encoded state."""
    return seal_many([(st, wake)])[0]


def seal_many(items: list[tuple[ScheduleState, datetime | None]]) -> list[bytes]:
    """``seal`` of each, compressed in one call into zstd (``pack_many``: one release of
    the GIL, not one per state — a busy event loop's thread waits for it each time)."""
    packed = pack_many([encode_schedule(st) for st, _ in items])
    return [_SEAL.pack((_QUIET if is_quiet(st) else 0) | _PACKED,
                       _NO_WAKE if wake is None else (wake - _EPOCH) // _US) + body
            for (st, wake), body in zip(items, packed, strict=True)]


def unseal(data: bytes) -> tuple[bool, int | None]:
    """(quiet, wake-up in microseconds since the epoch or None) of sealed bytes; a
    ``ValueError`` when they are too short."""
    if len(data) < SEAL_SIZE:
        raise ValueError(f"{len(data)} bytes: not a sealed state")
    flag, us = _SEAL.unpack_from(data)
    return bool(flag & _QUIET), (None if us == _NO_WAKE else us)


def unsealed(data: bytes) -> bytes:
    """The encoded state sealed bytes hold (``decode_schedule`` reads it)."""
    body = data[SEAL_SIZE:]
    if not data[0] & _PACKED:
        return body
    try:
        return unpack(CODEC_ZSTD_DICT_1, body)
    except zstandard.ZstdError as exc:
        raise ValueError(f"sealed bytes that do not expand: {exc}") from exc


def _unsealed_many(datas: list[bytes]) -> list[bytes]:
    return unpack_many([(CODEC_ZSTD_DICT_1 if d[0] & _PACKED else None, d[SEAL_SIZE:])
                        for d in datas])


class ScheduleStore:
    """key -> ``ScheduleState`` of a partition; idle states held as their sealed bytes."""

    def __init__(self, horizon: timedelta | None, wakeup: Wakeup) -> None:
        # None: nothing is ever held cold (every state stays an object)
        self.horizon = horizon
        self._wakeup = wakeup
        self._hot: dict[str, ScheduleState] = {}
        self._cold: dict[str, bytes] = {}
        # keys read or put since the last ``cool`` (only those may have become idle)
        self._touched: set[str] = set()
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
        yield from list(self._hot)
        yield from list(self._cold)

    def get(self, key: str, default: ScheduleState | None = None) -> ScheduleState | None:
        """The live state of ``key`` (a cold one is hydrated and stays hot), else
        ``default``."""
        st = self._hot.get(key)
        if st is None:
            data = self._cold.pop(key, None)
            if data is None:
                return default
            st = self._hot[key] = self._decode(data)
        if self.horizon is not None:
            self._touched.add(key)
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
        if self.horizon is not None:
            self._touched.add(key)

    __setitem__ = put

    def pop(self, key: str, default: ScheduleState | None = None) -> ScheduleState | None:
        """Remove ``key``: its state (hydrated when it was cold), else ``default``."""
        st = self.get(key)
        self._hot.pop(key, None)
        self._touched.discard(key)
        return default if st is None else st

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self.pop(key)

    def peek(self, key: str) -> ScheduleState | None:
        """The state of ``key`` for reading only: a cold one is decoded, not kept (changes
        to it are lost — ``get`` is for deciding)."""
        st = self._hot.get(key)
        if st is not None:
            return st
        data = self._cold.get(key)
        return None if data is None else self._decode(data)

    def items(self) -> Iterator[tuple[str, ScheduleState]]:
        """(key, state) of every state, for reading: the cold ones decoded, not kept."""
        yield from list(self._hot.items())
        for key, data in list(self._cold.items()):
            yield key, self._decode(data)

    def values(self) -> Iterator[ScheduleState]:
        for _, st in self.items():
            yield st

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
        """(key, sealed bytes) of the cold states."""
        return iter(list(self._cold.items()))

    def shapes(self) -> dict[str, Policy]:
        """Shape hash -> policy of the shapes the cold states name (store them beside)."""
        return dict(self._shapes)

    def add_shape(self, h: str, shape: Policy) -> None:
        """A validated shape (``decode_shape``) the cold states added by ``put_cold`` name."""
        self._shapes.setdefault(h, shape)

    def sealed(self, keys: list[str]) -> dict[str, tuple[bytes, Policy | None]]:
        """A snapshot's records of ``keys`` without hydrating them: key -> its sealed bytes
        and the policy whose shape they name (``shape_of``; a cold state's is its stored
        shape), for each key held. The hot ones are sealed in one call (``seal_many``)."""
        out: dict[str, tuple[bytes, Policy | None]] = {}
        hot: list[tuple[str, ScheduleState]] = []
        for key in keys:
            data = self._cold.get(key)
            if data is not None:
                ref = orjson.loads(unsealed(data))[_REF]
                out[key] = (data, None if ref is None else self._shapes.get(ref[1]))
            elif (st := self._hot.get(key)) is not None:
                hot.append((key, st))
        sealed = seal_many([(st, self._wakeup(st)) for _, st in hot])
        for (key, st), data in zip(hot, sealed, strict=True):
            out[key] = (data, st.policy)
        return out

    def put_cold(self, key: str, data: bytes, copy: bool = True) -> bool:
        """Hold a quiet state's sealed bytes as they are (a restore does not decode them):
        True; False, holding nothing, when they say the state is not quiet (decode it and
        ``put`` it). Its shape must be known (``add_shape``). ``copy``: keep a copy of
        ``data`` of its own size (``data`` may be a view into a larger buffer); False when
        the caller made ``data`` for this alone."""
        quiet, us = unseal(data)
        if not quiet:
            return False
        self._hot.pop(key, None)
        self._touched.discard(key)
        self._cold[key] = kept(data) if copy else data
        if us is not None:
            self._bucket(key, us // 60_000_000)
        return True

    @property
    def cooling(self) -> bool:
        """Whether ``cool`` has keys to look at."""
        return self.horizon is not None and bool(self._touched)

    def cool(self, now: datetime, limit: int | None = None) -> list[str]:
        """Turn the idle touched states cold (``is_idle``), at most ``limit`` of them looked
        at (the rest at the next call); the keys cooled, whose timers the caller disarms.
        Nothing when the horizon is None."""
        horizon = self.horizon
        if horizon is None:
            self._touched.clear()
            return []
        idle: list[tuple[str, ScheduleState, datetime | None]] = []
        touched = self._touched
        n = len(touched) if limit is None else min(limit, len(touched))
        for _ in range(n):
            key = touched.pop()
            st = self._hot.get(key)
            if st is None:
                continue
            wake = self._wakeup(st)
            if is_idle(st, wake, now, horizon):
                idle.append((key, st, wake))
        sealed = seal_many([(st, wake) for _, st, wake in idle])
        for (key, st, wake), data in zip(idle, sealed, strict=True):
            self._note_shape(st)
            self._cold[key] = data
            del self._hot[key]
            if wake is not None:
                self._bucket(key, wake_minute(wake))
        return [key for key, _, _ in idle]

    def next_warm(self) -> datetime | None:
        """When the earliest bucket's states should be warmed (its minute less the
        horizon); None when nothing is bucketed."""
        if not self._minutes or self.horizon is None:
            return None
        return datetime.fromtimestamp(self._minutes[0] * 60, UTC) - self.horizon

    def warm(self, now: datetime, limit: int | None = None) -> list[tuple[str, ScheduleState]]:
        """Hydrate the cold states whose wake-up comes within the horizon of ``now`` (the
        buckets up to it, earliest first; at most ``limit`` states, the rest at the next
        call); (key, state) of each, whose timer the caller arms."""
        until = wake_minute(now + (self.horizon or timedelta(0)))
        keys: list[str] = []
        minutes = self._minutes
        while minutes and minutes[0] <= until:
            if limit is not None and len(keys) >= limit:
                break
            minute = heapq.heappop(minutes)
            bucket = self._buckets.pop(minute)
            for i, key in enumerate(bucket):
                if limit is not None and len(keys) >= limit:
                    self._buckets[minute] = bucket[i:]  # the rest at the next call
                    heapq.heappush(minutes, minute)
                    break
                if key in self._cold:
                    keys.append(key)
        keys = list(dict.fromkeys(keys))  # a key bucketed twice in one minute: once
        # expanded in one call into zstd (one release of the GIL)
        bodies = _unsealed_many([self._cold.pop(key) for key in keys])
        out: list[tuple[str, ScheduleState]] = []
        for key, body in zip(keys, bodies, strict=True):
            st = self._hot[key] = decode_schedule(body, self._shapes)
            self._touched.add(key)
            out.append((key, st))
        return out

    def soonest_cold(self, n: int) -> list[ScheduleState]:
        """Up to ``n`` cold states of the earliest buckets, decoded for reading (what comes
        next among the cold ones; a reader's list of upcoming instants)."""
        out: list[ScheduleState] = []
        seen: set[str] = set()
        for minute in sorted(self._minutes):
            for key in self._buckets.get(minute, ()):
                data = self._cold.get(key)
                if data is not None and key not in seen:
                    seen.add(key)
                    out.append(self._decode(data))
            if len(out) >= n:
                break
        return out

    # ---------------------------------------------------------------- parts

    def _decode(self, data: bytes) -> ScheduleState:
        return decode_schedule(unsealed(data), self._shapes)

    def _note_shape(self, st: ScheduleState) -> None:
        pol = st.policy
        if pol is not None:
            h, body = shape_of(pol)
            if h not in self._shapes:
                self._shapes[h] = decode_shape(body)[1]

    def _bucket(self, key: str, minute: int) -> None:
        keys = self._buckets.get(minute)
        if keys is None:
            keys = self._buckets[minute] = []
            heapq.heappush(self._minutes, minute)
        keys.append(key)
