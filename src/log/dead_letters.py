"""Dead letters: the one place a consumer puts a record it cannot use.

A record that does not decode (bytes that are not JSON, JSON that is not an event, a command
or a hint) or that fails to apply (a value the read model refuses, a decision that raises)
must neither stop its consumer nor be retried forever nor vanish. The consumer writes a
``DeadLetter`` (chronolog.domain.messages) naming the record (topic, partition, offset), the
consumer, the error's class and message and the record's bytes to the ``dlq`` topic, then
moves past the record. ``chronolog dlq list`` shows them; the metrics count them
(``chronolog_dead_letters_total{consumer, topic}``).

A dead letter names the tenant and schedule ID of its record when the record names them
(``named_by``): the ``tenant`` / ``schedule_id`` of its JSON (commands, events, assignments
and replies carry them), else its key when it is a ``tenant/schedule_id`` key of
``commands`` or ``events`` (bytes that are not JSON still have one). Only values of the
shape of a tenant name and a schedule ID count; anything else names nothing.

A dead letter's key is ``<consumer>|<topic>|<partition>|<offset>``: a consumer that
dead-letters a record and crashes before its progress is stored does it again after a
restart, and ``read_dead_letters`` keeps one letter per key.

The processor puts its dead letters in its own transaction (``record``); every other consumer
appends them (``DeadLetters.put``) before it stores progress past the record, so a crash in
between leaves the record to be dead-lettered again, never skipped unrecorded.
"""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog

from chronolog.domain import codec
from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.log.port import EventLog, OutRecord, Record, Topics
from chronolog.log.reading import read_partition

__all__ = [
    "ORIGINAL_LIMIT",
    "REASON_LIMIT",
    "DeadLetters",
    "dead_letter",
    "describe",
    "named_by",
    "read_dead_letters",
]

log = structlog.get_logger("chronolog.dead_letters")

ORIGINAL_LIMIT = 64 * 1024  # bytes of the original record kept in a dead letter
REASON_LIMIT = 1000  # characters of the error message kept


def describe(error: BaseException | str) -> tuple[str, str]:
    """(error class, one-line message) of an error, the message bounded."""
    if isinstance(error, str):
        return "Rejected", error[:REASON_LIMIT]
    text = str(error).replace("\n", " ").strip() or repr(error)
    return type(error).__name__, text[:REASON_LIMIT]


_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")  # as CommandEnvelope.tenant
_SCHEDULE_ID = re.compile(lim.SCHEDULE_ID_PATTERN)
_SCHEDULE_ID_MAX = 200


def _tenant_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and _TENANT.match(value) else None


def _schedule_or_none(value: Any) -> str | None:
    return value if (isinstance(value, str) and 0 < len(value) <= _SCHEDULE_ID_MAX
                     and _SCHEDULE_ID.match(value)) else None


def named_by(topics: Topics, topic: str, key: bytes | None, value: bytes
             ) -> tuple[str | None, str | None]:
    """(tenant, schedule ID) a record names, each None when it names none (module doc)."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and _tenant_or_none(doc.get("tenant")) is not None:
        return doc["tenant"], _schedule_or_none(doc.get("schedule_id"))
    if key is not None and topic in (topics.commands, topics.events):
        try:
            tenant, _, schedule_id = key.decode().partition("/")
        except UnicodeDecodeError:
            return None, None
        if _tenant_or_none(tenant) is not None:
            return tenant, _schedule_or_none(schedule_id)
    return None, None


def dead_letter(
    topics: Topics, rec: Record, consumer: str, error: BaseException | str,
    command_id: str | None = None, at: datetime | None = None,
) -> OutRecord:
    """The ``dlq`` record for ``rec``, skipped by ``consumer`` because of ``error``."""
    error_class, reason = describe(error)
    tenant, schedule_id = named_by(topics, rec.topic, rec.key, rec.value)
    dl = m.DeadLetter(
        reason=reason, original=base64.b64encode(rec.value[:ORIGINAL_LIMIT]).decode(),
        source_partition=rec.partition, source_offset=rec.offset, command_id=command_id,
        source_topic=rec.topic, consumer=consumer, error_class=error_class,
        original_size=len(rec.value), dead_lettered_at=at or datetime.now(UTC),
        tenant=tenant, schedule_id=schedule_id)
    key = f"{consumer}|{rec.topic}|{rec.partition}|{rec.offset}".encode()
    return OutRecord(topic=topics.dlq, key=key, value=codec.encode_dead_letter(dl))


@dataclass
class DeadLetters:
    """A consumer's dead-letter writer: appends, logs and counts (``counts`` by topic)."""

    log: EventLog
    consumer: str
    counts: Counter[str] = field(default_factory=Counter)

    def record(self, rec: Record, error: BaseException | str,
               command_id: str | None = None) -> OutRecord:
        """The dead letter of ``rec`` (logged and counted), for the caller to write."""
        out = dead_letter(self.log.topics, rec, self.consumer, error, command_id)
        error_class, reason = describe(error)
        self.counts[rec.topic] += 1
        log.warning("record_dead_lettered", consumer=self.consumer, topic=rec.topic,
                    partition=rec.partition, offset=rec.offset, error_class=error_class,
                    reason=reason, command_id=command_id)
        return out

    async def put(self, rec: Record, error: BaseException | str,
                  command_id: str | None = None) -> None:
        """Append the dead letter of ``rec``; raises if the log refuses (then the caller
        must not move past ``rec``)."""
        await self.log.append([self.record(rec, error, command_id)])

    async def put_many(self, items: Sequence[tuple[Record, BaseException | str]]) -> None:
        if items:
            await self.log.append([self.record(rec, err) for rec, err in items])

    @property
    def total(self) -> int:
        return sum(self.counts.values())


async def read_dead_letters(
    log_: EventLog, keep: Callable[[m.DeadLetter], bool] | None = None,
) -> list[m.DeadLetter]:
    """Every dead letter in the log (one per key), oldest first; ``keep`` filters."""
    topic = log_.topics.dlq
    seen: set[bytes] = set()
    out: list[tuple[Any, m.DeadLetter]] = []
    for p in range(await log_.partitions_for(topic)):
        async for recs in read_partition(log_, topic, p):
            for rec in recs:
                if rec.key is not None and rec.key in seen:
                    continue
                try:
                    dl = codec.decode_dead_letter(rec.value)
                except (ValueError, orjson.JSONDecodeError):
                    continue  # not a dead letter (nothing reads this topic but us)
                if rec.key is not None:
                    seen.add(rec.key)
                if not dl.source_topic:  # written before the field existed: a command
                    dl = dl.model_copy(update={"source_topic": log_.topics.commands})
                if keep is None or keep(dl):
                    out.append(((dl.dead_lettered_at or _EPOCH, rec.timestamp_ms, p,
                                 rec.offset), dl))
    out.sort(key=lambda x: x[0])
    return [dl for _, dl in out]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
