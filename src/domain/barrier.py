"""The move barrier: the order in which a reader of several partitions of ``events`` takes a
moved key's events (docs/design.md §9, §10, §18).

A key handed over from partition p to q at routing version v has its events on p up to its
``KeyMovedOut``, then on q from its ``KeyMovedIn(from_partition=p, version=v)``. p's
``HandedOver(version=v)`` follows every ``KeyMovedOut`` of that handover in p's log (one
transaction), so a reader that folds partitions independently keeps a moved key's order by
one rule: **a partition is read past a ``KeyMovedIn`` only once its old home's
``HandedOver`` of that version has been taken** (``barrier_met``). A reader records, per
partition, the highest routing version whose ``HandedOver`` it has taken (``Handovers``): a
partition hands over to each version once, in increasing order, so that number says which
of its handovers are behind the reader.

The rule never deadlocks a log the processors wrote: the ``HandedOver`` a ``KeyMovedIn``
waits for was written before the adopt command it was decided from, so following the
waits goes back in time and ends. A ``KeyMovedIn`` whose ``HandedOver`` is nowhere (a
forged or damaged log) holds its partition for good: ``stuck`` names those.

Pure: no I/O, no clock. ``BarrierOrder`` is the whole-log readers' (audit, replay) state;
the live projector applies ``cut_at_barrier`` to each batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from chronolog.domain import messages as m

__all__ = ["Barrier", "BarrierOrder", "Handovers", "barrier_met", "barrier_of", "cut_at_barrier",
           "handed_over", "in_barrier_order", "record_handovers"]

# partition -> the highest routing version whose HandedOver was taken (0 / absent: none)
Handovers = Mapping[int, int]


@dataclass(frozen=True, slots=True)
class Barrier:
    """What a ``KeyMovedIn`` waits for: ``partition``'s ``HandedOver`` of ``version``."""

    partition: int
    version: int


def barrier_of(env: m.EventEnvelope) -> Barrier | None:
    """The barrier an event waits behind: only a ``KeyMovedIn`` has one (its old home's
    handover of its version — both values are in the event)."""
    p = env.payload
    if isinstance(p, m.KeyMovedIn):
        return Barrier(p.from_partition, p.version)
    return None


def handed_over(env: m.EventEnvelope) -> int | None:
    """The routing version a ``HandedOver`` event hands over to (None for any other)."""
    p = env.payload
    return p.version if isinstance(p, m.HandedOver) else None


def barrier_met(handovers: Handovers, barrier: Barrier) -> bool:
    """Whether the old home's handover of the barrier's version has been taken."""
    return handovers.get(barrier.partition, 0) >= barrier.version


def record_handovers(handovers: MutableMapping[int, int], partition: int,
                     envelopes: Sequence[m.EventEnvelope]) -> int:
    """Fold the ``HandedOver`` events of ``partition``'s ``envelopes`` into ``handovers``;
    the highest version among them (0: none)."""
    top = 0
    for env in envelopes:
        v = handed_over(env)
        if v is not None and v > top:
            top = v
    if top > handovers.get(partition, 0):
        handovers[partition] = top
    return top


def cut_at_barrier(envelopes: Sequence[m.EventEnvelope], handovers: Handovers
                   ) -> tuple[int, Barrier | None]:
    """How many of one partition's next ``envelopes`` (in log order) may be taken now: up to
    the first ``KeyMovedIn`` whose barrier is not met (and that barrier; None when all may).

    ``handovers`` are the ones taken *before* these envelopes: a ``HandedOver`` among the
    envelopes of another partition read alongside does not count (it is not taken yet)."""
    for i, env in enumerate(envelopes):
        b = barrier_of(env)
        if b is not None and not barrier_met(handovers, b):
            return i, b
    return len(envelopes), None


@dataclass
class BarrierOrder:
    """A whole-log reader's barrier state: the handovers taken so far, and which partition
    waits for which barrier.

    Feed each partition's next envelopes to ``take``; it answers how many may be taken now
    and records their handovers. A partition that waits (``waiting``) is offered again
    after others were taken; when no partition can go on, the waiting ones are ``stuck``
    and a reader that reads on anyway ``release``s one of them (``to_release``)."""

    handovers: dict[int, int] = field(default_factory=dict)
    waiting: dict[int, Barrier] = field(default_factory=dict)
    released: set[int] = field(default_factory=set)

    def take(self, partition: int, envelopes: Sequence[m.EventEnvelope]) -> int:
        """How many of ``envelopes`` (``partition``'s next, in log order) are taken now."""
        skip = 1 if partition in self.released and envelopes else 0
        self.released.discard(partition)
        n, barrier = cut_at_barrier(envelopes[skip:], self.handovers)
        n += skip
        record_handovers(self.handovers, partition, envelopes[:n])
        if barrier is None:
            self.waiting.pop(partition, None)
        else:
            self.waiting[partition] = barrier
        return n

    def ready(self, partition: int) -> bool:
        """Whether ``partition`` may be read on (it waits for no barrier, or a met one)."""
        b = self.waiting.get(partition)
        return b is None or partition in self.released or barrier_met(self.handovers, b)

    def stuck(self) -> dict[int, Barrier]:
        """The waiting partitions whose barrier is not met (when nothing else can go on: a
        ``KeyMovedIn`` whose handover is not in the log)."""
        return {p: b for p, b in self.waiting.items()
                if p not in self.released and not barrier_met(self.handovers, b)}

    def to_release(self) -> int | None:
        """The stuck partition to read on first: one waiting for a partition that waits for
        nothing (its handover is really missing), else the lowest."""
        stuck = self.stuck()
        if not stuck:
            return None
        lone = [p for p, b in stuck.items() if b.partition not in stuck]
        return min(lone or stuck)

    def release(self, partition: int) -> Barrier | None:
        """Let ``partition`` take the ``KeyMovedIn`` it waits at without its barrier (the
        handovers taken are unchanged); the barrier it waited for."""
        b = self.waiting.pop(partition, None)
        if b is not None:
            self.released.add(partition)
        return b


def in_barrier_order(
    partitions: Mapping[int, Sequence[tuple[int, m.EventEnvelope]]],
    on_stuck: Callable[[int, int, Barrier], None] | None = None,
) -> Iterator[tuple[int, int, m.EventEnvelope]]:
    """Every partition's ``(offset, envelope)`` pairs (each in log order) as ``(partition,
    offset, envelope)``, in barrier order: each partition in turn as far as it can go. When
    none can go on, ``on_stuck(partition, offset, barrier)`` is told about the one
    ``to_release`` names and it goes on past it; without ``on_stuck`` the order ends there."""
    order = BarrierOrder()
    pos = dict.fromkeys(partitions, 0)
    while True:
        progressed = False
        for p in sorted(partitions):
            items = partitions[p][pos[p]:]
            if not items or not order.ready(p):
                continue
            n = order.take(p, [env for _, env in items])
            for offset, env in items[:n]:
                yield p, offset, env
            pos[p] += n
            progressed = progressed or n > 0
        if progressed:
            continue
        stuck = order.to_release()
        if stuck is None or on_stuck is None:
            return
        barrier = order.release(stuck)
        assert barrier is not None
        on_stuck(stuck, partitions[stuck][pos[stuck]][0], barrier)
