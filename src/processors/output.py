"""The records of one partition's transaction (``Output``): its events, dead letters,
assignments, commands to other aggregates and replies — the replies built last, inside the
transaction, once the events' log positions are known."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.port import WAKE_HEADER, OutRecord, Position, Record
from chronolog.processors.snapshots import Chunk, SnapshotWriter
from chronolog.telemetry import tracing

# reply kinds inside Output.replies
_NEW, _BYTES, _AGAIN, _FROM = 0, 1, 2, 3


class Output:
    """The records of one partition's transaction, in order; replies are built last.

    A reply carries the exact log positions of the events its command caused. Those are
    only known once the events are appended, so replies are produced by ``then(positions)``
    inside the same transaction (the port's two-phase commit). Replies are kept as encoded
    bytes (``final``: command_id -> bytes, the processor's duplicate cache) — a ``Reply``
    model is never built on this path.
    """

    def __init__(self, topics: Any, partition: int,
                 writer: tuple[tuple[str, bytes], ...] = (),
                 snap: SnapshotWriter | None = None, chunk: Chunk | None = None) -> None:
        self.topics = topics
        self.events_topic = topics.events
        self.partition = partition
        self.writer = writer  # headers naming the processor and its epoch (audit trail)
        # the partition's snapshot: this transaction's events move its end; ``chunk``: the
        # states this transaction writes to ``state`` (framed in ``then``, once positioned)
        self.snap = snap
        self.chunk = chunk
        self._snap_base: tuple[int, tuple[int, str] | None] | None = None
        self.records: list[OutRecord] = []
        # assignment records: written after the events, with the replies (``then``), so that the
        # first records are this partition's events only — a Kafka owner can then predict
        # their positions and send everything in one round trip (chronolog.log.kafka)
        self.assignments: list[OutRecord] = []
        # commands to other aggregates (the quota saga), written with the assignments
        self.commands: list[OutRecord] = []
        # (event_id, key, tenant, schedule_id, at, causation_id, payload) of each event;
        # envelope models are only built for on_commit hooks (``envelopes``)
        self.events: list[tuple[str, str, str, str, datetime, str, Any]] = []
        self.event_index: list[int] = []  # index in records of each event
        # (kind, command_id, data): _NEW data = (status, reason, body json, tenant,
        # schedule_id, first event, end event); _BYTES data = the reply's bytes; _AGAIN
        # data = None (same command earlier in this batch); _FROM data = the earlier
        # Output whose transaction (committed before ours) holds the original reply
        self.replies: list[tuple[int, str, Any]] = []
        self.final: dict[str, bytes] = {}
        self.seen: set[str] = set()
        self.reply_to: dict[str, str] = {}  # command_id -> the client its reply wakes
        # with tracing on: the last traced command's ID and the link to its decision span,
        # the cause the spans of the runs it materializes link to (``traced``)
        self.cause: tracing.Cause | None = None

    @property
    def empty(self) -> bool:
        return (not self.records and not self.replies and not self.assignments
                and not self.commands and self.chunk is None)

    def event(self, event_id: str, key: str, tenant: str, schedule_id: str, at: datetime,
              causation_id: str, payload: Any, value: bytes) -> None:
        """Append an event whose bytes (``value``) the processor encoded already."""
        self.events.append((event_id, key, tenant, schedule_id, at, causation_id, payload))
        self.event_index.append(len(self.records))
        self.records.append(OutRecord(self.events_topic, key.encode(), value, self.partition,
                                      self.writer))
        if tracing.enabled:  # a run's occurrence and claim spans (docs/tracing.md)
            tracing.run_event(tenant, schedule_id, causation_id, payload, self.cause)

    def traced(self, rec: Record, env: m.CommandEnvelope, dec: Any) -> None:
        """With tracing on, the span of a command's decision (``dec``), when its record
        carries a ``traceparent``: made before its events are, which link to it."""
        if tracing.enabled:
            self.cause = tracing.decided(env.type, env.command_id, env.tenant, env.schedule_id,
                                         dec.status, dec.events, rec.headers, rec.timestamp_ms)

    def envelopes(self) -> list[m.EventEnvelope]:
        return [m.EventEnvelope(event_id=event_id, type=payload.type, version=m.CURRENT_VERSION,
                                key=key, tenant=tenant, schedule_id=schedule_id, at=at,
                                causation_id=causation_id, payload=payload)
                for event_id, key, tenant, schedule_id, at, causation_id, payload in self.events]

    def reply_new(self, command_id: str, status: str, reason: str, body: bytes, tenant: str,
                  schedule_id: str, first_event: int, end_event: int) -> None:
        self.replies.append((_NEW, command_id,
                             (status, reason, body, tenant, schedule_id, first_event, end_event)))
        self.seen.add(command_id)

    def reply_bytes(self, command_id: str, data: bytes) -> None:
        self.replies.append((_BYTES, command_id, data))

    def reply_again(self, command_id: str) -> None:
        self.replies.append((_AGAIN, command_id, None))

    def reply_from(self, command_id: str, earlier: Output) -> None:
        self.replies.append((_FROM, command_id, earlier))

    def then(self, positions: list[Position]) -> list[OutRecord]:
        """The assignment records, then the replies with the positions of their events (called
        inside the transaction; again if a prediction of the positions was wrong)."""
        out = list(self.assignments) + self.commands
        final: dict[str, bytes] = {}
        topic, partition = self.topics.replies, self.partition
        for kind, cid, data in self.replies:
            if kind == _NEW:
                status, reason, body, tenant, schedule_id, a, b = data
                pos = [(positions[i].topic, positions[i].partition, positions[i].offset)
                       for i in self.event_index[a:b]]
                value = codec.encode_reply_fields(cid, status, reason, body, pos, tenant,
                                                  schedule_id)
            elif kind == _BYTES:
                value = data
            elif kind == _AGAIN:
                value = final[cid]
            else:
                value = data.final[cid]  # committed before this transaction began
            final[cid] = value
            to = self.reply_to.get(cid)
            out.append(OutRecord(topic=topic, key=cid.encode(), value=value, partition=partition,
                                 headers=((WAKE_HEADER, to.encode()),) if to else ()))
        self.final = final
        snap = self.snap
        if snap is not None:
            self._then_snapshot(snap, positions, out)
        return out

    def _then_snapshot(self, snap: SnapshotWriter, positions: list[Position],
                       out: list[OutRecord]) -> None:
        """The chunk's records (``SnapshotWriter.transaction``); the partition's end before
        this transaction is taken at the first call (``then`` may be called again)."""
        base = self._snap_base
        if base is None:
            base = self._snap_base = (snap.log_end, snap.last_event)
        index = self.event_index
        span = None if not index else (positions[index[0]].offset,
                                       positions[index[-1]].offset, self.events[-1][0])
        out.extend(snap.transaction(self.chunk, span, base))
