"""Reading every partition of ``events`` to a fixed end in move-barrier order (the whole-log
readers: ``chronolog audit``, ``chronolog replay``).

``read_in_order(log, topic, stops)`` yields ``Taken`` chunks — one partition's next records,
decoded, in log order — so that a moved key's events come in its order across partitions:
a partition is read past a ``KeyMovedIn`` only after its old home's ``HandedOver`` of that
version was yielded (``chronolog.domain.barrier``). Partitions are otherwise read one
chunk each in turn. Whatever the partition count change (keys may move to a higher or a
lower partition number), the order is the one the live projector applies.

When no partition can go on and some wait for a handover the log does not have (a
``KeyMovedIn`` without its ``HandedOver``): with ``on_stuck`` None the reading ends there
(those partitions stop before it, as the live projector holds them); else ``on_stuck(partition,
barrier, record)`` is called and that partition reads on past it (the audit reports it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from chronolog.domain import messages as m
from chronolog.domain.barrier import Barrier, BarrierOrder
from chronolog.domain.codec import DecodeError, decode_event
from chronolog.log.port import Record
from chronolog.log.reading import READ_BATCH, Readable

__all__ = ["Taken", "read_in_order"]


Stuck = Callable[[int, Barrier, Record], None]


@dataclass
class Taken:
    """One partition's next records in barrier order: each with its envelope, or the error
    it does not decode with; ``end``: the offset after them."""

    partition: int
    items: list[tuple[Record, m.EventEnvelope | DecodeError]]
    end: int

    @property
    def envelopes(self) -> list[m.EventEnvelope]:
        return [e for _, e in self.items if isinstance(e, m.EventEnvelope)]


@dataclass
class _Cursor:
    partition: int
    position: int
    stop: int
    buffer: list[tuple[Record, m.EventEnvelope | DecodeError]] = field(default_factory=list)
    done: bool = False


async def read_in_order(
    log: Readable, topic: str, stops: Mapping[int, int], *,
    until: datetime | None = None, on_stuck: Stuck | None = None, batch: int = READ_BATCH,
    order: BarrierOrder | None = None, starts: Mapping[int, int] | None = None,
) -> AsyncIterator[Taken]:
    """Chunks of every partition of ``stops`` (partition -> end offset) from its offset in
    ``starts`` (default 0), in barrier order (module docstring; ``order``: the barrier state
    where an earlier reading ended, so it goes on from ``starts``). ``until``: each partition
    ends before its first event whose authority time is later."""
    order = order or BarrierOrder()
    starts = starts or {}
    cursors = [_Cursor(p, starts.get(p, 0), stop, done=stop <= starts.get(p, 0))
               for p, stop in sorted(stops.items())]
    while True:
        progressed = False
        for c in cursors:
            if c.done or not order.ready(c.partition):
                continue
            if not c.buffer:
                await _fill(log, topic, c, until, batch)
                if c.done:
                    continue
            taken = _take(order, c)
            if taken is not None:
                progressed = True
                yield taken
        if progressed:
            continue
        waiting = order.to_release()
        if waiting is None or on_stuck is None:
            return  # all read, or the rest waits for handovers the log does not have
        barrier = order.release(waiting)
        assert barrier is not None
        cursor = next(c for c in cursors if c.partition == waiting)
        on_stuck(waiting, barrier, cursor.buffer[0][0])


def _take(order: BarrierOrder, c: _Cursor) -> Taken | None:
    """The cursor's buffered records up to its first unmet barrier (None: none of them)."""
    envs = [e for _, e in c.buffer if isinstance(e, m.EventEnvelope)]
    n = order.take(c.partition, envs)
    if n == len(envs):
        k = len(c.buffer)
    else:
        barrier_env = envs[n]
        k = next(i for i, (_, e) in enumerate(c.buffer) if e is barrier_env)
    if k == 0:
        return None
    items, c.buffer = c.buffer[:k], c.buffer[k:]
    c.position = items[-1][0].offset + 1
    if not c.buffer and c.position >= c.stop:
        c.done = True
    return Taken(c.partition, items, c.position)


async def _fill(log: Readable, topic: str, c: _Cursor, until: datetime | None,
                batch: int) -> None:
    """Read the cursor's next records (decoded) into its buffer; done at its end."""
    if c.position >= c.stop:
        c.done = True
        return
    records = await log.read(topic, c.partition, c.position, max_records=batch, timeout_ms=0)
    records = [r for r in records if r.offset < c.stop]
    if not records:
        c.done = True  # only aborted data / control markers remain below the end (Kafka)
        return
    for rec in records:
        try:
            env: m.EventEnvelope | DecodeError = decode_event(rec.value)
        except DecodeError as exc:
            env = exc
        if until is not None and isinstance(env, m.EventEnvelope) and env.at > until:
            c.stop = rec.offset  # the partition ends before it
            break
        c.buffer.append((rec, env))
    if not c.buffer:
        c.done = True
