"""Audit checkpoints on the log: where ``chronolog audit`` stopped, and its state there.

An audit that starts from its last checkpoint reads only the events written since (docs/
design.md §10, "Checkpoints"). The checkpoint lives on the deployment's log, on the
compacted one-partition topic ``audit`` (``Topics.audit``), so every audit of a deployment —
whoever runs it, wherever — continues from the same place, and the log's pruning can see how
far the audit has come (an event is removed only once every checkpoint is past it).

A checkpoint (``AuditCheckpoint``) is an opaque document (the auditor's state, written by
``chronolog.audit``) and where it stands on ``events``: per partition the next offset to
read, the event ID just before it (a checkpoint of another log, or of a log restored to an
earlier point, is recognised and not used), and the handovers the move-barrier order has
taken (``chronolog.domain.barrier``).

Layout: the document is compressed (zlib) and cut into chunks of at most ``CHUNK_BYTES``
(below Kafka's default record size limit), written under the keys ``<slot>/<i>`` of one of
two slots, ``a`` and ``b``, then the *head* (key ``head``, JSON) naming the slot, the chunk
count and the SHA-256 of the compressed document. A save writes the slot the current head
does not name, and the head last: a save that dies half-way leaves the previous checkpoint
whole. A head whose chunks do not match its checksum is reported (``CheckpointUnreadable``),
never half-used.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from chronolog.log.port import EventLog, LogError, OutRecord
from chronolog.log.reading import read_partition

CHUNK_BYTES = 512 * 1024
HEAD = b"head"
FORMAT = 1


class CheckpointUnreadable(LogError):
    """The topic ``audit`` holds a head whose chunks are missing or do not match it."""


@dataclass(frozen=True)
class AuditCheckpoint:
    """Where an audit stopped on ``events`` and its state there."""

    positions: dict[int, int]  # partition -> the next offset to read
    last_events: dict[int, str]  # partition -> the event ID at position - 1 (if any)
    handovers: dict[int, int] = field(default_factory=dict)  # barrier state
    events: int = 0  # events audited in total
    taken_at: str = ""  # ISO 8601, for the operator
    document: bytes = b""  # the auditor's state (``save_checkpoint`` also takes it in pieces)


async def _latest(log: EventLog) -> dict[bytes, bytes]:
    """The latest value of each key on ``audit`` (compaction keeps at least that)."""
    topic = log.topics.audit
    try:
        await log.partitions_for(topic)
    except LogError:
        return {}  # never written: no checkpoint
    latest: dict[bytes, bytes] = {}
    async for batch in read_partition(log, topic, 0):
        for rec in batch:
            if rec.key is not None:
                latest[rec.key] = rec.value
    return latest


def _head(latest: dict[bytes, bytes]) -> dict[str, Any] | None:
    raw = latest.get(HEAD)
    if raw is None:
        return None
    try:
        head = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CheckpointUnreadable(f"audit checkpoint head does not decode: {exc}") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise CheckpointUnreadable("audit checkpoint head of another format: "
                                   f"{head.get('format') if isinstance(head, dict) else head!r}")
    return head


async def load_checkpoint(log: EventLog) -> AuditCheckpoint | None:
    """The latest checkpoint (None: there is none); ``CheckpointUnreadable`` when its
    chunks are missing or damaged."""
    latest = await _latest(log)
    head = _head(latest)
    if head is None:
        return None
    try:
        slot, chunks, digest = str(head["slot"]), int(head["chunks"]), str(head["sha256"])
        data = b"".join(latest[f"{slot}/{i}".encode()] for i in range(chunks))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointUnreadable(f"audit checkpoint incomplete: {exc!r}") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointUnreadable("audit checkpoint chunks do not match their head (sha256)")
    try:
        document = zlib.decompress(data)
        positions = {int(p): int(o) for p, o in head["positions"].items()}
        last = {int(p): str(e) for p, e in head["last_events"].items()}
        handovers = {int(p): int(v) for p, v in head["handovers"].items()}
    except (zlib.error, KeyError, AttributeError, TypeError, ValueError) as exc:
        raise CheckpointUnreadable(f"audit checkpoint damaged: {exc!r}") from None
    return AuditCheckpoint(positions, last, handovers, int(head.get("events", 0)),
                           str(head.get("taken_at", "")), document)


async def checkpoint_positions(log: EventLog) -> dict[int, int] | None:
    """Where the latest checkpoint stands on ``events`` (None: no checkpoint): the head
    alone, for a reader that only needs how far the audit has come."""
    head = _head(await _latest(log))
    if head is None:
        return None
    return {int(p): int(o) for p, o in head["positions"].items()}


async def checkpoint_needs(log: EventLog) -> dict[int, int] | None:
    """Per partition, the first offset of ``events`` the latest checkpoint still reads: the
    event it checks on resuming (its last event), else its position (None: no checkpoint;
    a partition it does not name: 0). The log's pruning keeps everything from there.
    ``CheckpointUnreadable`` when the head does not decode: nothing may go then."""
    head = _head(await _latest(log))
    if head is None:
        return None
    needs = {int(p): int(o) for p, o in head["positions"].items()}
    for p, where in head["last_events"].items():
        offset = str(where).partition(":")[0]
        if offset.isdigit():
            needs[int(p)] = min(needs.get(int(p), 0), int(offset))
    return needs


def _compressed(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """``pieces`` compressed as one zlib stream, as the compressor gives it out."""
    compressor = zlib.compressobj(6)
    for piece in pieces:
        out = compressor.compress(piece)
        if out:
            yield out
    yield compressor.flush()


async def save_checkpoint(log: EventLog, checkpoint: AuditCheckpoint,
                          pieces: Iterable[bytes] | None = None) -> None:
    """Write ``checkpoint`` as the latest: its chunks into the slot the current head does not
    name, then the head (module docstring). ``pieces``: its document given in order, in place
    of ``checkpoint.document``, streamed into the compressor (a state of a million schedules
    is never one string)."""
    topic = log.topics.audit
    await log.ensure_topic(topic, 1)
    latest = await _latest(log)
    try:
        current = _head(latest)
    except CheckpointUnreadable:
        current = None
    slot = "b" if current is not None and current.get("slot") == "a" else "a"
    if pieces is None:
        pieces = (checkpoint.document,)
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    pending = bytearray()
    for piece in _compressed(pieces):
        digest.update(piece)
        pending += piece
        while len(pending) >= CHUNK_BYTES:
            chunks.append(bytes(pending[:CHUNK_BYTES]))
            del pending[:CHUNK_BYTES]
    if pending or not chunks:
        chunks.append(bytes(pending))
    head = {"format": FORMAT, "slot": slot, "chunks": len(chunks),
            "sha256": digest.hexdigest(),
            "positions": {str(p): o for p, o in sorted(checkpoint.positions.items())},
            "last_events": {str(p): e for p, e in sorted(checkpoint.last_events.items())},
            "handovers": {str(p): v for p, v in sorted(checkpoint.handovers.items())},
            "events": checkpoint.events, "taken_at": checkpoint.taken_at}
    records = [OutRecord(topic, f"{slot}/{i}".encode(), chunk, partition=0)
               for i, chunk in enumerate(chunks)]
    await log.append(records)
    await log.append([OutRecord(topic, HEAD, orjson.dumps(head), partition=0)])
