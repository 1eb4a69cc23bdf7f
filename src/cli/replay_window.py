"""Replay of the window: how ``chronolog replay`` rebuilds the rows of a pruned partition
from its latest snapshot and the events the log still holds (docs/design.md §9, "Replay of
the window").

A partition of ``events`` pruned below offset s (design §20) keeps its latest snapshot's
events: pruning never goes past the event the snapshot's marker checks. The snapshot is read
as a takeover reads it (``load_window``: partition p of ``state`` whole, decoded by
``decode_snapshot_async``, the event the marker names checked in the log): each schedule
state as of its record's ``through`` T, the marker's ``fold_from`` F. The partition's rows
are then built in four steps, each written through the projection's own code
(``project_batch`` and ``PostgresProjectionStore.apply``, as the live projector writes):

1. ``seed``: the states' ``schedules`` and ``runs`` rows (and the calendars' rows)
   (``chronolog.projections.window.state_rows``; the times a state does not carry as
   first-writer-wins stand-ins), and the partition's stored offset moved to just after the
   event the marker names (``Window.resume``; only transaction markers lie between it
   and F);
2. ``fold_before``: the retained events of each key *before* its state, offsets in
   ``[s, T)``, over those rows: the rows of the runs the log holds whole (those that
   started and finished within the window, which the state no longer keeps), and the
   columns only events give. A column an event writes ends with the last value written
   before T, which is the state's where it carries the column, so the order is safe; a
   stand-in gives way to any event's value;
3. ``seed_effects``: the effects of the states' runs, after the retained intents gave
   their creation times;
4. the replay's usual fold from ``Window.resume`` on (``chronolog.cli.replay.replay``),
   each key's events from its T on, as a takeover folds its tail.

A key without a record (none changed before F) has T = F. Retention then runs as after any
replay, and ``drop_unknown_finishes`` removes the finished runs whose finish was pruned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from chronolog.domain import messages as m
from chronolog.domain.codec import DecodeError, decode_event
from chronolog.log.port import EventLog, LogError
from chronolog.log.reading import read_partition
from chronolog.processors.snapshots import Loaded, SnapshotRejected, decode_snapshot_async
from chronolog.projections.project import project_batch
from chronolog.projections.store import PostgresProjectionStore
from chronolog.projections.window import effect_rows, state_rows

__all__ = ["Window", "WindowUnavailable", "fold_before", "load_window", "seed", "seed_effects"]


class WindowUnavailable(Exception):
    """A pruned partition whose snapshot cannot start a replay (the reason)."""


@dataclass
class Window:
    """A pruned partition's starting point: its snapshot and its first retained event."""

    partition: int
    start: int  # the first offset the log holds
    loaded: Loaded
    before: datetime  # the authority time of the first retained event
    last_at: datetime  # ... of the event the snapshot's marker names (the last before F)

    @property
    def fold_from(self) -> int:
        return self.loaded.fold_from

    def through(self, key: str) -> int:
        """The offset of ``events`` the state of ``key`` is as of (F for a key without one)."""
        return self.loaded.through.get(key, self.loaded.fold_from)

    @property
    def resume(self) -> int:
        """Where the replay's fold goes on: after the event the marker names, the last one
        before F (only transaction markers lie between), as a projector's offset stands."""
        assert self.loaded.last_event is not None  # checked by load_window
        return self.loaded.last_event[0] + 1

    @property
    def last_through(self) -> int:
        """The highest offset a state is as of: a replay may not stop before it."""
        return max([self.loaded.fold_from, *self.loaded.through.values()])


async def load_window(log: EventLog, partition: int, start: int) -> Window:
    """Partition ``partition``'s latest snapshot, decoded as a takeover decodes it, and
    checked against the log (the event its marker names is there); ``WindowUnavailable``
    when there is none, it is rejected, or it does not fit what the log holds."""
    topics = log.topics
    try:
        records = [r async for recs in read_partition(log, topics.state, partition, 0)
                   for r in recs]
    except LogError as exc:
        raise WindowUnavailable(f"no state topic ({exc})") from None
    end = await log.end_offset(topics.events, partition)
    try:
        loaded = await decode_snapshot_async(records, end)
    except SnapshotRejected as exc:
        raise WindowUnavailable(f"its snapshot is not usable: {exc}") from None
    if loaded is None:
        raise WindowUnavailable("it has no snapshot")
    check = loaded.last_event
    if check is None or check[0] < start:
        raise WindowUnavailable("its snapshot's last event was pruned")
    found = await log.read(topics.events, partition, check[0], max_records=1, timeout_ms=0)
    last = _decoded(found[0].value) if found and found[0].offset == check[0] else None
    if last is None or last.event_id != check[1]:
        raise WindowUnavailable(f"its snapshot's last event {check[1]} at {check[0]} is not "
                                "in the log")
    return Window(partition, start, loaded, await _first_time(log, partition, start, end),
                  last.at)


def _decoded(value: bytes) -> m.EventEnvelope | None:
    try:
        return decode_event(value)
    except DecodeError:
        return None


async def _first_time(log: EventLog, partition: int, start: int, end: int) -> datetime:
    async for recs in read_partition(log, log.topics.events, partition, start, end):
        for rec in recs:
            try:
                return decode_event(rec.value).at
            except DecodeError:
                continue
    raise WindowUnavailable(f"no event decodes from offset {start} on")


async def fold_before(log: EventLog, store: PostgresProjectionStore, windows: Mapping[int, Window],
                      stops: Mapping[int, int], batch: int) -> tuple[int, int]:
    """Step 2 (module docstring): each window's retained events of every key before its
    state, projected without moving the stored offsets; (events projected, changes that
    found no row)."""
    events = missing = 0
    for p, w in sorted(windows.items()):
        stop = min(w.last_through, stops.get(p, w.last_through))
        async for recs in read_partition(log, log.topics.events, p, w.start, stop, batch):
            envs: list[m.EventEnvelope] = []
            for rec in recs:
                try:
                    env = decode_event(rec.value)
                except DecodeError:
                    continue  # named by the fold from F on, or skipped as the projector does
                if rec.offset < w.through(env.key):
                    envs.append(env)
            if envs:
                result = await store.apply(project_batch(envs), {})
                events += len(envs)
                missing += sum(len(keys) for keys in result.missing.values())
    return events, missing


async def seed(store: PostgresProjectionStore, topic: str,
               windows: Mapping[int, Window]) -> None:
    """Step 1 (module docstring): each window's schedules and runs from its states, its
    offset moved to F."""
    for p, w in sorted(windows.items()):
        await store.apply(state_rows(w.loaded.states.values(), w.before,
                                     w.loaded.quotas.values()),
                          {(topic, p): (0, w.resume)},
                          last_event_at={(topic, p): w.last_at})


async def seed_effects(store: PostgresProjectionStore, windows: Mapping[int, Window]) -> None:
    """Step 3 (module docstring): the effects of the states' runs (no offset moves)."""
    for _, w in sorted(windows.items()):
        await store.apply(effect_rows(w.loaded.states.values(), w.before), {})
