"""The audit's checkpoint store (chronolog.log.audit_checkpoints) on every log adapter: a
checkpoint reads back whole, a save cut short leaves the previous one, a damaged one is
reported and never half-used."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from chronolog.log.audit_checkpoints import (
    CHUNK_BYTES,
    AuditCheckpoint,
    CheckpointUnreadable,
    checkpoint_positions,
    load_checkpoint,
    save_checkpoint,
)
from chronolog.log.port import EventLog, OutRecord


def _checkpoint(n: int, size: int) -> AuditCheckpoint:
    # hash-chained bytes: as incompressible as random ones, and the same every run
    blocks, h = [], f"doc-{n}".encode()
    for _ in range(size // 32 + 1):
        h = hashlib.sha256(h).digest()
        blocks.append(h)
    return AuditCheckpoint({0: 10 * n, 1: 3}, {0: f"{10 * n - 1}:e{n}"}, {1: 2}, 13 * n,
                           f"2026-12-0{n}T00:00:00Z", b"".join(blocks)[:size])


async def test_no_checkpoint_until_one_is_saved(event_log: EventLog) -> None:
    assert await load_checkpoint(event_log) is None
    assert await checkpoint_positions(event_log) is None


async def test_a_checkpoint_larger_than_a_chunk_reads_back_whole(event_log: EventLog) -> None:
    big = _checkpoint(1, 2 * CHUNK_BYTES + 1000)  # three chunks
    await save_checkpoint(event_log, big)
    assert await load_checkpoint(event_log) == big
    assert await checkpoint_positions(event_log) == big.positions
    small = _checkpoint(2, 100)  # into the other slot; the first slot's chunks stay behind
    await save_checkpoint(event_log, small)
    assert await load_checkpoint(event_log) == small
    third = _checkpoint(3, CHUNK_BYTES + 1)  # back into the first slot, over its chunks
    await save_checkpoint(event_log, third)
    assert await load_checkpoint(event_log) == third


async def test_a_document_given_in_pieces_reads_back_as_their_bytes_in_order(
    event_log: EventLog,
) -> None:
    # given a document of three chunks and more, handed to the save as 997-byte pieces
    whole = _checkpoint(1, 2 * CHUNK_BYTES + 5000)
    data = whole.document
    pieces = (data[i:i + 997] for i in range(0, len(data), 997))
    # when it is saved, then it reads back as the one document
    await save_checkpoint(event_log, replace(whole, document=b""), pieces)
    assert await load_checkpoint(event_log) == whole


async def test_a_save_cut_short_before_its_head_leaves_the_previous_checkpoint(
    event_log: EventLog,
) -> None:
    first = _checkpoint(1, 1000)
    await save_checkpoint(event_log, first)  # slot a
    # a second save wrote its chunks into slot b and died before its head
    await event_log.append([OutRecord(event_log.topics.audit, b"b/0", b"half of a save",
                                      partition=0)])
    assert await load_checkpoint(event_log) == first


async def test_a_damaged_chunk_is_reported_not_used(event_log: EventLog) -> None:
    await save_checkpoint(event_log, _checkpoint(1, 1000))
    await event_log.append([OutRecord(event_log.topics.audit, b"a/0", b"altered",
                                      partition=0)])
    with pytest.raises(CheckpointUnreadable, match="do not match their head"):
        await load_checkpoint(event_log)
    # the next save goes on: a new checkpoint replaces the damaged one
    fresh = _checkpoint(2, 1000)
    await save_checkpoint(event_log, fresh)
    assert await load_checkpoint(event_log) == fresh
