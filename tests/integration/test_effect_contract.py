"""The effect-adapter contract (``chronolog.effect_adapters.base``): one suite, every adapter.

Each adapter runs against a real destination on loopback — the webhook against an asyncio
HTTP server (three configurations: ``idempotent``, ``queryable``, ``none``), the PostgreSQL
inbox against the test database, the Kafka adapter on the embedded log and on the Kafka
broker, email against an aiosmtpd server — and every test states a rule of the port:

* an adapter is an ``EffectAdapter`` and declares one of the contracts;
* a delivery succeeds once, with JSON evidence, and carries the effect ID to the destination;
* under ``idempotent`` and ``transactional`` a repeated delivery of the same effect ID is
  applied once (by the destination, or by a consumer deduplicating on the effect-ID key);
* an unreachable destination is ``retry_later`` and nothing was applied;
* a permanent refusal is ``failed``, marked permanent, nothing applied (nor recorded);
* a reply lost after the destination may have acted is settled as the contract allows:
  repeated with the same key (``idempotent``), asked about (``queryable``), or left
  ``uncertain`` and never sent again (``none``);
* a ``transactional`` effect commits together with a record of its effect ID.

A ``Destination`` wraps one adapter with its destination and says what the destination
holds; the tests only use that interface. A rule that cannot be provoked against a real
destination (a reply lost by PostgreSQL or Kafka) is checked where it can be.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email import message_from_bytes
from pathlib import Path
from typing import Any, get_args

import asyncpg
import orjson
import pytest

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.effect_adapters.base import Contract, EffectAdapter, EffectContext
from chronolog.effect_adapters.kafka_topic import KafkaEffectAdapter
from chronolog.effect_adapters.postgres_inbox import PostgresInboxEffectAdapter
from chronolog.effect_adapters.smtp import EmailEffectAdapter
from chronolog.effect_adapters.webhook import WebhookEffectAdapter
from chronolog.log.port import EventLog, LogError, OutRecord, Record, Topics
from support.net import free_port
from support.polling import wait_until

from .effect_servers import HookServer, SmtpServer

TENANT, SCHEDULE = "acme", "s1"


def new_intent(kind: str, config: dict[str, Any], checksum: str = "c1") -> m.EffectIntended:
    run_id = f"r_{uuid.uuid4().hex[:12]}"
    return m.EffectIntended(effect_id=f"{kind}-{run_id}", run_id=run_id,
                            kind=kind,  # type: ignore[arg-type]
                            config=config, checksum=checksum, inline={"total": 57}, attempt=1)


async def read_topic(log: EventLog, topic: str) -> list[Record]:
    """Every committed record of ``topic`` (none if it does not exist)."""
    try:
        n = await log.partitions_for(topic)
    except LogError:
        return []
    out: list[Record] = []
    for p in range(n):
        end, pos = await log.end_offset(topic, p), 0
        while pos < end:
            batch = await log.read(topic, p, pos)
            if not batch:
                break
            out.extend(batch)
            pos = batch[-1].offset + 1
    return out


class Destination:
    """One adapter and its real destination (subclasses fill in the destination's side)."""

    name = ""
    contract: Contract = "none"
    adapter: EffectAdapter

    async def close(self) -> None:
        await self.adapter.close()

    def config(self) -> dict[str, Any]:
        """A working destination."""
        raise NotImplementedError

    def unreachable(self) -> dict[str, Any]:
        """A destination nothing answers at (connection refused)."""
        raise NotImplementedError

    async def refusing(self) -> dict[str, Any]:
        """A destination that will refuse the next delivery for good."""
        raise NotImplementedError

    def lose_next_reply(self) -> None:
        """The next delivery reaches the destination, which acts; its reply is lost."""
        raise NotImplementedError

    def ctx(self, intent: m.EffectIntended) -> EffectContext:
        return EffectContext(tenant=TENANT, schedule_id=SCHEDULE,
                             intended_at=datetime.now(UTC))

    def declared(self, intent: m.EffectIntended) -> Contract:
        contract_for = getattr(self.adapter, "contract_for", None)
        return contract_for(intent.config) if contract_for else self.adapter.contract

    async def applied(self, effect_id: str) -> int:
        """How many times the effect took effect, once the destination (or a consumer, by
        the declared key) has deduplicated by the effect ID."""
        raise NotImplementedError

    async def transmissions(self, effect_id: str) -> int:
        """How many deliveries of the effect reached the destination."""
        raise NotImplementedError

    async def carried_ids(self, effect_id: str) -> list[str]:
        """The effect ID as each delivery that reached the destination carried it."""
        raise NotImplementedError

    async def recorded(self, effect_id: str) -> bool:
        """``transactional``: the record of the effect ID committed with the effect."""
        raise NotImplementedError

    async def visible(self, effect_id: str) -> None:
        """Wait until a delivery that succeeded can be seen by the destination's readers
        (at once, except where the destination makes it visible a little later)."""


class Webhook(Destination):
    def __init__(self, name: str, contract: Contract, server: HookServer) -> None:
        self.name, self.contract, self.server = name, contract, server
        self.adapter = WebhookEffectAdapter()

    async def close(self) -> None:
        await super().close()
        await self.server.close()

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"url": self.server.url, "backoff": "10ms", "timeout": "2s",
                               "allow_private": True, "status_interval": "10ms"}
        if self.contract != "idempotent":
            cfg["idempotent"] = False
        if self.contract == "queryable":
            cfg["status_url"] = self.server.status_url
        return cfg

    def unreachable(self) -> dict[str, Any]:
        return {**self.config(), "url": f"http://127.0.0.1:{free_port()}/hook"}

    async def refusing(self) -> dict[str, Any]:
        self.server.plan = ["400"]
        return self.config()

    def lose_next_reply(self) -> None:
        self.server.plan = ["drop"]

    def _committed(self, effect_id: str) -> list[dict[str, Any]]:
        return [c for c in self.server.committed if c["body"]["effect_id"] == effect_id]

    async def applied(self, effect_id: str) -> int:
        return len(self._committed(effect_id))

    async def transmissions(self, effect_id: str) -> int:
        return self.server.keys_seen.count(effect_id)

    async def carried_ids(self, effect_id: str) -> list[str]:
        return [str(c["key"]) for c in self._committed(effect_id)]  # the Idempotency-Key


class PostgresInbox(Destination):
    name = "postgres_inbox"
    contract: Contract = "transactional"

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        suffix = uuid.uuid4().hex[:8]
        self.inbox, self.table = f"inbox_{suffix}", f"invoices_{suffix}"
        self.adapter = PostgresInboxEffectAdapter()
        self.sql = f"INSERT INTO {self.table} (effect_id, doc) VALUES ($2, $1::jsonb)"

    async def start(self) -> PostgresInbox:
        await self._execute(f"CREATE TABLE {self.table} (effect_id text, doc jsonb)")
        return self

    async def close(self) -> None:
        await super().close()
        await self._execute(f"DROP TABLE IF EXISTS {self.table}; "
                            f"DROP TABLE IF EXISTS {self.inbox}")

    async def _execute(self, sql: str) -> None:
        conn = await asyncpg.connect(self.database_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.database_url)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    def config(self) -> dict[str, Any]:
        return {"dsn": self.database_url, "inbox_table": self.inbox, "sql": self.sql}

    def unreachable(self) -> dict[str, Any]:
        return {**self.config(), "dsn": f"postgresql://chronolog@127.0.0.1:{free_port()}/x"}

    async def refusing(self) -> dict[str, Any]:
        return {**self.config(), "sql": "INSERT INTO no_such_table VALUES ($1, $2)"}

    async def applied(self, effect_id: str) -> int:
        rows = await self._fetch(f"SELECT 1 FROM {self.table} WHERE effect_id = $1", effect_id)
        return len(rows)

    async def transmissions(self, effect_id: str) -> int:
        return await self.applied(effect_id)

    async def carried_ids(self, effect_id: str) -> list[str]:
        # the inbox row; the adapter creates the inbox table on its first connection
        [exists] = await self._fetch("SELECT to_regclass($1) IS NOT NULL AS e", self.inbox)
        if not exists["e"]:
            return []
        rows = await self._fetch(f"SELECT effect_id FROM {self.inbox} WHERE effect_id = $1",
                                 effect_id)
        return [r["effect_id"] for r in rows]

    async def recorded(self, effect_id: str) -> bool:
        return bool(await self.carried_ids(effect_id))


class KafkaTopic(Destination):
    """The Kafka adapter: on the embedded log (``idempotent``: the record is appended again
    on a repeat, keyed by the effect ID) or on Kafka (``transactional``: the result, the
    outcome command and the runner's group offset in one Kafka transaction)."""

    def __init__(self, name: str, log: EventLog, topic: str) -> None:
        self.name, self.log, self.topic = name, log, topic
        self.contract = "transactional" if name.endswith("kafka") else "idempotent"
        self.adapter = KafkaEffectAdapter(log, "contract")
        self.group = f"{log.topics.prefix}effects"
        self.intent_offset = 0

    async def start(self) -> KafkaTopic:
        await self.log.start()
        await self.log.ensure_topics()
        # the EffectIntended record the runner would have read: its offset is committed
        # with the effect on Kafka
        [pos] = await self.log.append([OutRecord(self.log.topics.events, None, b"intent",
                                                 partition=0)])
        self.intent_offset = pos.offset
        return self

    async def close(self) -> None:
        await super().close()
        await self.log.close()

    def config(self) -> dict[str, Any]:
        return {"topic": self.topic}

    def unreachable(self) -> dict[str, Any]:
        return {**self.config(), "bootstrap": f"127.0.0.1:{free_port()}"}

    async def refusing(self) -> dict[str, Any]:
        return {"topic": self.log.topics.commands}  # one of chronolog's own topics

    def ctx(self, intent: m.EffectIntended) -> EffectContext:
        def outcome(status: str, evidence: dict[str, Any]) -> m.CommandEnvelope:
            return m.CommandEnvelope(
                command_id=f"effect-outcome:{intent.effect_id}:{intent.attempt}",
                type="RecordEffectOutcome", tenant=TENANT, schedule_id=SCHEDULE,
                issued_at=datetime.now(UTC),
                payload=m.RecordEffectOutcome(run_id=intent.run_id, effect_id=intent.effect_id,
                                              outcome=status,  # type: ignore[arg-type]
                                              evidence=evidence))

        return EffectContext(tenant=TENANT, schedule_id=SCHEDULE,
                             intended_at=datetime.now(UTC), runner_id="contract",
                             group=self.group, events_topic=self.log.topics.events,
                             partition=0, offset=self.intent_offset, outcome_envelope=outcome)

    async def _results(self, effect_id: str) -> list[Record]:
        return [r for r in await read_topic(self.log, self.topic)
                if orjson.loads(r.value)["effect_id"] == effect_id]

    async def applied(self, effect_id: str) -> int:
        return len({r.key for r in await self._results(effect_id)})  # consumers dedupe by key

    async def transmissions(self, effect_id: str) -> int:
        return len(await self._results(effect_id))

    async def carried_ids(self, effect_id: str) -> list[str]:
        return [(r.key or b"").decode() for r in await self._results(effect_id)]

    async def visible(self, effect_id: str) -> None:
        # Kafka acknowledges EndTxn before its commit markers are written: for a few
        # milliseconds a read_committed reader does not see the transaction yet
        await wait_until(lambda: self._results(effect_id), 10, "the effect's record visible")

    async def recorded(self, effect_id: str) -> bool:
        committed = await self.log.committed(self.group, self.log.topics.events, 0)
        outcomes = [codec.decode_command(r.value).payload
                    for r in await read_topic(self.log, self.log.topics.commands)]
        return committed == self.intent_offset + 1 and any(
            getattr(p, "effect_id", None) == effect_id for p in outcomes)


class Email(Destination):
    name = "smtp"
    contract: Contract = "none"

    def __init__(self) -> None:
        self.server = SmtpServer().start()
        self.adapter = EmailEffectAdapter()

    async def close(self) -> None:
        await super().close()
        self.server.stop()

    def config(self) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.server.port, "from": "chronolog@example.com",
                "to": ["ops@example.com"], "timeout": "3s"}

    def unreachable(self) -> dict[str, Any]:
        return {**self.config(), "port": free_port()}

    async def refusing(self) -> dict[str, Any]:
        self.server.handler.refuse = {"nobody@example.com"}
        return {**self.config(), "to": ["nobody@example.com"]}

    def lose_next_reply(self) -> None:
        self.server.handler.drop_after_data = 1

    async def carried_ids(self, effect_id: str) -> list[str]:
        """From each message's ``Message-ID: <effect_id.attempt@chronolog>``."""
        ids = []
        for raw in self.server.messages:
            local = str(message_from_bytes(raw)["Message-ID"]).strip("<>").split("@")[0]
            ids.append(local.rsplit(".", 1)[0])
        return [i for i in ids if i == effect_id]

    async def applied(self, effect_id: str) -> int:
        return len(await self.carried_ids(effect_id))  # no deduplication: every message

    async def transmissions(self, effect_id: str) -> int:
        return await self.applied(effect_id)


DESTINATIONS = ["webhook", "webhook-queryable", "webhook-none", "postgres_inbox",
                "kafka_topic-sqlite", "kafka_topic-kafka", "smtp"]
LOSES_REPLIES = ["webhook", "webhook-queryable", "webhook-none", "smtp"]
TRANSACTIONAL = ["postgres_inbox", "kafka_topic-kafka"]
REPEATABLE = ["webhook", "postgres_inbox", "kafka_topic-sqlite", "kafka_topic-kafka"]


async def open_destination(name: str, request: pytest.FixtureRequest) -> Destination:
    if name.startswith("webhook"):
        contract: Contract = {"webhook": "idempotent", "webhook-queryable": "queryable",
                              "webhook-none": "none"}[name]  # type: ignore[assignment]
        return Webhook(name, contract, await HookServer(dedup=contract != "none").start())
    if name == "postgres_inbox":
        return await PostgresInbox(request.getfixturevalue("database_url")).start()
    if name == "kafka_topic-sqlite":
        from chronolog.log.sqlite import SqliteEventLog

        tmp_path: Path = request.getfixturevalue("tmp_path")
        log: EventLog = SqliteEventLog(tmp_path / "log.db", Topics("t.", 2))
        return await KafkaTopic(name, log, "acme.invoices").start()
    if name == "kafka_topic-kafka":
        from chronolog.log.kafka import KafkaEventLog

        topics = Topics(request.getfixturevalue("topic_prefix"), 2)
        log = KafkaEventLog(request.getfixturevalue("kafka_bootstrap"), topics)
        return await KafkaTopic(name, log, topics.effects).start()
    assert name == "smtp"
    return Email()


@pytest.fixture
async def dest(request: pytest.FixtureRequest) -> AsyncIterator[Destination]:
    d = await open_destination(str(request.param), request)
    try:
        yield d
    finally:
        await d.close()


def over(names: list[str]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("dest", names, indirect=True)


# ------------------------------------------------------------------------------ the rules


@over(DESTINATIONS)
async def test_an_adapter_is_an_effect_adapter_declaring_one_of_the_contracts(
    dest: Destination,
) -> None:
    assert isinstance(dest.adapter, EffectAdapter)
    i = new_intent(dest.adapter.kind, dest.config())
    assert dest.declared(i) == dest.contract
    assert dest.contract in get_args(Contract)


@over(DESTINATIONS)
async def test_a_delivery_succeeds_once_with_json_evidence_and_carries_the_effect_id(
    dest: Destination,
) -> None:
    i = new_intent(dest.adapter.kind, dest.config())
    out = await dest.adapter.perform(i, i.inline, dest.ctx(i))
    assert out.status == "succeeded", out.evidence
    assert isinstance(orjson.loads(orjson.dumps(out.evidence)), dict)
    await dest.visible(i.effect_id)
    assert await dest.applied(i.effect_id) == 1
    assert await dest.carried_ids(i.effect_id) == [i.effect_id]


@over(REPEATABLE)
async def test_a_repeated_delivery_is_applied_once_under_idempotent_and_transactional(
    dest: Destination,
) -> None:
    assert dest.contract in ("idempotent", "transactional")
    i = new_intent(dest.adapter.kind, dest.config())
    outs = [await dest.adapter.perform(i, i.inline, dest.ctx(i)) for _ in range(3)]
    assert [o.status for o in outs] == ["succeeded"] * 3, [o.evidence for o in outs]
    await dest.visible(i.effect_id)
    assert await dest.applied(i.effect_id) == 1
    assert set(await dest.carried_ids(i.effect_id)) == {i.effect_id}


@over(DESTINATIONS)
async def test_an_unreachable_destination_is_retry_later_and_nothing_is_applied(
    dest: Destination,
) -> None:
    i = new_intent(dest.adapter.kind, dest.unreachable())
    out = await dest.adapter.perform(i, i.inline, dest.ctx(i))
    assert out.status == "retry_later", out.evidence
    assert await dest.applied(i.effect_id) == 0


@over(DESTINATIONS)
async def test_a_permanent_refusal_is_failed_marked_permanent_and_nothing_is_applied(
    dest: Destination,
) -> None:
    i = new_intent(dest.adapter.kind, await dest.refusing())
    out = await dest.adapter.perform(i, i.inline, dest.ctx(i))
    assert out.status == "failed", out.evidence
    assert out.evidence["permanent"] is True
    assert await dest.applied(i.effect_id) == 0
    if dest.contract == "transactional":
        assert not await dest.recorded(i.effect_id)


@over(LOSES_REPLIES)
async def test_a_lost_reply_is_settled_as_the_contract_allows(dest: Destination) -> None:
    i = new_intent(dest.adapter.kind, dest.config())
    dest.lose_next_reply()
    out = await dest.adapter.perform(i, i.inline, dest.ctx(i))
    if dest.contract == "idempotent":  # repeated with the same key, applied once
        assert out.status == "succeeded", out.evidence
        assert await dest.transmissions(i.effect_id) == 2
    elif dest.contract == "queryable":  # asked, not repeated
        assert out.status == "succeeded" and out.evidence["via"] == "status_url"
        assert await dest.transmissions(i.effect_id) == 1
    else:  # none: an operator decides; never sent again
        assert dest.contract == "none"
        assert out.status == "uncertain", out.evidence
        assert await dest.transmissions(i.effect_id) == 1
    assert await dest.applied(i.effect_id) == 1


@over(TRANSACTIONAL)
async def test_a_transactional_effect_commits_with_a_record_of_its_effect_id(
    dest: Destination,
) -> None:
    assert dest.contract == "transactional"
    i = new_intent(dest.adapter.kind, dest.config())
    assert not await dest.recorded(i.effect_id)
    out = await dest.adapter.perform(i, i.inline, dest.ctx(i))
    assert out.status == "succeeded", out.evidence
    await dest.visible(i.effect_id)
    assert await dest.recorded(i.effect_id)
    assert await dest.applied(i.effect_id) == 1
