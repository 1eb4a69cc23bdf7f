"""Effect adapter contracts against real destinations on loopback (no mocks).

Webhook against an asyncio HTTP server deduplicating by Idempotency-Key; email against an
aiosmtpd server that can drop its reply after DATA; the PostgreSQL inbox against the test
database; the Kafka adapter's embedded-log path (its Kafka transaction path runs end to end
in test_effect_runner.py).
"""

from __future__ import annotations

import asyncio
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from chronolog.domain import messages as m
from chronolog.effect_adapters.base import EffectContext
from chronolog.effect_adapters.kafka_topic import KafkaEffectAdapter
from chronolog.effect_adapters.postgres_inbox import PostgresInboxEffectAdapter
from chronolog.effect_adapters.smtp import EmailEffectAdapter
from chronolog.effect_adapters.webhook import WebhookEffectAdapter
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from support.net import free_port

from .effect_servers import HookServer, SmtpServer


def intent(kind: str, config: dict[str, Any], checksum: str = "c1", attempt: int = 1,
           run_id: str | None = None) -> m.EffectIntended:
    run_id = run_id or f"r_{uuid.uuid4().hex[:12]}"
    return m.EffectIntended(effect_id=f"{kind}-{run_id}", run_id=run_id, kind=kind,  # type: ignore[arg-type]
                            config=config, checksum=checksum, inline={"total": 57},
                            attempt=attempt)


def ctx(age_s: float = 0.0) -> EffectContext:
    return EffectContext(tenant="acme", schedule_id="s1",
                         intended_at=datetime.now(UTC) - timedelta(seconds=age_s))


# the test servers are on loopback: these destinations allow private addresses
FAST = {"backoff": "10ms", "timeout": "2s", "allow_private": True}


@pytest.fixture
async def hook() -> AsyncIterator[HookServer]:
    srv = await HookServer().start()
    yield srv
    await srv.close()


@pytest.fixture
def smtp() -> Any:
    srv = SmtpServer().start()
    yield srv
    srv.stop()


# ---------------------------------------------------------------------- webhook


async def test_webhook_2xx_succeeds_with_receipt_and_the_effect_id_as_key(hook: HookServer) -> None:
    i = intent("webhook", {"url": hook.url, **FAST})
    out = await WebhookEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "succeeded" and out.evidence["status"] == 200
    assert out.evidence["receipt"] == "receipt_900"
    assert hook.keys_seen == [i.effect_id]
    assert hook.committed[0]["body"]["result"] == {"total": 57}


@pytest.mark.parametrize("failure", ["drop", "500"])
async def test_webhook_ambiguous_try_is_repeated_with_the_same_key_and_commits_once(
    hook: HookServer, failure: str,
) -> None:
    hook.plan = [failure]
    i = intent("webhook", {"url": hook.url, **FAST})
    out = await WebhookEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "succeeded" and out.evidence["receipt"] == "receipt_900"
    assert hook.keys_seen == [i.effect_id, i.effect_id]
    assert len(hook.committed) == 1
    assert (out.evidence["tries"][0].get("sent") == "maybe"
            or out.evidence["tries"][0]["status"] == 500)


async def test_webhook_4xx_is_a_permanent_failure_and_not_retried(hook: HookServer) -> None:
    hook.plan = ["400"]
    i = intent("webhook", {"url": hook.url, **FAST})
    out = await WebhookEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "failed" and out.evidence["status"] == 400
    assert len(hook.keys_seen) == 1 and not hook.committed


async def test_webhook_5xx_retries_are_bounded_then_retry_later(hook: HookServer) -> None:
    hook.plan = ["503"] * 3
    i = intent("webhook", {"url": hook.url, "max_attempts": 3, **FAST})
    out = await WebhookEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "retry_later"  # safe: same key, within the retention
    assert len(hook.keys_seen) == 3 and not hook.committed


async def test_webhook_past_the_retention_never_resends_blindly(hook: HookServer) -> None:
    i = intent("webhook", {"url": hook.url, "retention": "1h", **FAST})
    out = await WebhookEffectAdapter().perform(i, i.inline, ctx(age_s=2 * 3600))
    assert out.status == "uncertain" and "retention" in out.evidence["reason"]
    assert hook.keys_seen == []


async def test_webhook_status_url_settles_a_lost_response_without_a_second_post(
    hook: HookServer,
) -> None:
    hook.plan = ["drop"]
    i = intent("webhook", {"url": hook.url, "status_url": hook.status_url, "idempotent": False,
                           "status_interval": "10ms", **FAST})
    adapter = WebhookEffectAdapter()
    assert adapter.contract_for(i.config) == "queryable"
    out = await adapter.perform(i, i.inline, ctx())
    assert out.status == "succeeded" and out.evidence["via"] == "status_url"
    assert out.evidence["receipt"] == "receipt_900"
    assert len(hook.keys_seen) == 1 and len(hook.committed) == 1


async def test_webhook_status_not_found_stays_uncertain_without_idempotency(
    hook: HookServer,
) -> None:
    hook.plan = ["503"]  # not committed, but 5xx is ambiguous to the client
    i = intent("webhook", {"url": hook.url, "status_url": hook.status_url, "idempotent": False,
                           "status_checks": 3, "status_interval": "10ms", **FAST})
    out = await WebhookEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "uncertain"
    assert out.evidence["tries"][-1]["status_checks"] == ["not_found"] * 3
    assert len(hook.keys_seen) == 1  # never a second POST


async def test_webhook_connection_refused_is_retry_later() -> None:
    i = intent("webhook", {"url": f"http://127.0.0.1:{free_port()}/hook", "max_attempts": 2,
                           **FAST})
    out = await WebhookEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "retry_later"
    assert all(t["sent"] is False for t in out.evidence["tries"])


# ---------------------------------------------------------------------- email


async def test_webhook_reads_at_most_the_cap_of_a_huge_response_and_posts_once(
        hook: HookServer) -> None:
    """A 2xx with a 64 MiB body: the runner reads 1 MiB, the effect counts as delivered, the
    rest is never read (memory stays bounded) and nothing is POSTed a second time."""
    hook.plan = ["huge"]
    adapter = WebhookEffectAdapter(max_response_bytes=1 << 20)
    tracemalloc.start()
    try:
        out = await adapter.perform(intent("webhook", {"url": hook.url, **FAST}), {"a": 1}, ctx())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await adapter.close()
    assert out.status == "succeeded"
    assert out.evidence["tries"][-1]["body_truncated"] is True
    assert out.evidence["tries"][-1]["body_bytes"] == 1 << 20
    assert len(hook.keys_seen) == 1 and len(hook.committed) == 1
    assert peak < 16 << 20, f"peak {peak} bytes while reading a 64 MiB response"
    assert hook.huge_sent < hook.huge_bytes  # the client stopped reading: the rest never came
    # an uncompressed answer is asked for: a compressed one could inflate past the cap
    assert hook.requests[0][1]["accept-encoding"] == "identity"


async def test_webhook_deeply_nested_json_is_not_json_and_not_an_error(hook: HookServer) -> None:
    hook.plan = ["deep"]
    adapter = WebhookEffectAdapter()
    try:
        out = await adapter.perform(intent("webhook", {"url": hook.url, **FAST}), {"a": 1}, ctx())
    finally:
        await adapter.close()
    assert out.status == "succeeded" and out.evidence["receipt"] is None
    assert len(hook.committed) == 1


async def test_webhook_status_url_answering_deep_json_is_not_an_error(hook: HookServer) -> None:
    """The status URL's answer is parsed with the same limit: a nesting bomb there is an
    unreadable answer (still uncertain), not an exception that escapes the adapter."""
    hook.plan = ["drop"]  # a lost response, then the status URL is asked
    hook.status_deep = True
    adapter = WebhookEffectAdapter()
    try:
        out = await adapter.perform(
            intent("webhook", {"url": hook.url, "idempotent": False,
                               "status_url": hook.status_url, "status_checks": 1, **FAST}),
            {"a": 1}, ctx())
    finally:
        await adapter.close()
    assert out.status == "uncertain"
    assert out.evidence["tries"][-1]["status_checks"] == ["http 200"]


@pytest.mark.parametrize("url", ["http://", "ftp://example.com/hook", "not a url",
                                 "http://[::1/hook"])
async def test_webhook_with_an_unusable_url_fails_and_sends_nothing(url: str) -> None:
    """Nothing can have been sent: the outcome is failed, never uncertain."""
    adapter = WebhookEffectAdapter()
    try:
        out = await adapter.perform(intent("webhook", {"url": url, **FAST}), {"a": 1}, ctx())
    finally:
        await adapter.close()
    assert out.status == "failed" and out.evidence["sent"] is False


def email_cfg(smtp: SmtpServer, **kw: Any) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": smtp.port, "from": "chronolog@example.com",
            "to": ["ops@example.com"], "timeout": "3s", **kw}


async def test_email_is_sent_once_with_the_effect_id_in_message_id(smtp: SmtpServer) -> None:
    i = intent("email", email_cfg(smtp))
    out = await EmailEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "succeeded" and out.evidence["smtp_code"] == 250
    assert len(smtp.messages) == 1
    assert f"<{i.effect_id}.1@chronolog>".encode() in smtp.messages[0]


async def test_email_reply_lost_after_data_is_uncertain_and_never_resent(smtp: SmtpServer) -> None:
    smtp.handler.drop_after_data = 1
    i = intent("email", email_cfg(smtp))
    out = await EmailEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "uncertain" and out.evidence["phase"] == "data"
    assert len(smtp.messages) == 1


async def test_email_rcpt_refused_before_data_is_a_failure_and_nothing_is_sent(
    smtp: SmtpServer,
) -> None:
    smtp.handler.refuse = {"nobody@example.com"}
    i = intent("email", email_cfg(smtp, to="nobody@example.com"))
    out = await EmailEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "failed" and out.evidence["phase"] == "rcpt"
    assert out.evidence["smtp_code"] == 550 and smtp.messages == []


async def test_email_connection_refused_is_a_safe_retry_later() -> None:
    i = intent("email", {"host": "127.0.0.1", "port": free_port(), "to": "a@example.com",
                         "timeout": "2s"})
    out = await EmailEffectAdapter().perform(i, i.inline, ctx())
    assert out.status == "retry_later" and out.evidence["phase"] == "connect"


# ---------------------------------------------------------------------- postgres inbox


@pytest.fixture
async def pg_tables(database_url: str) -> AsyncIterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    inbox, biz = f"inbox_{suffix}", f"invoices_{suffix}"
    conn = await asyncpg.connect(database_url)
    await conn.execute(f"CREATE TABLE {biz} (effect_id text, doc jsonb)")
    try:
        yield inbox, biz
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {biz}; DROP TABLE IF EXISTS {inbox}")
        await conn.close()


async def test_postgres_inbox_applies_a_repeated_intent_exactly_once(
    database_url: str, pg_tables: tuple[str, str],
) -> None:
    inbox, biz = pg_tables
    i = intent("postgres", {"dsn": database_url, "inbox_table": inbox,
                            "sql": f"INSERT INTO {biz} (effect_id, doc) VALUES ($2, $1::jsonb)"})
    adapter = PostgresInboxEffectAdapter()
    try:
        outs = await asyncio.gather(*(adapter.perform(i, i.inline, ctx()) for _ in range(5)))
        again = await adapter.perform(i, i.inline, ctx())
        conflict = await adapter.perform(i.model_copy(update={"checksum": "other"}), {}, ctx())
    finally:
        await adapter.close()
    assert all(o.status == "succeeded" for o in [*outs, again])
    assert sorted(o.evidence["duplicate"] for o in outs) == [False, True, True, True, True]
    assert again.evidence["duplicate"] is True
    assert conflict.status == "failed" and "conflict" in conflict.evidence["reason"]
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(f"SELECT effect_id, doc FROM {biz}")
        inbox_rows = await conn.fetch(f"SELECT effect_id, run_id, checksum FROM {inbox}")
    finally:
        await conn.close()
    assert len(rows) == 1 and orjson.loads(rows[0]["doc"]) == {"total": 57}
    assert [(r["effect_id"], r["checksum"]) for r in inbox_rows] == [(i.effect_id, "c1")]


async def test_postgres_business_sql_error_rolls_back_the_inbox_row(
    database_url: str, pg_tables: tuple[str, str],
) -> None:
    inbox, _ = pg_tables
    i = intent("postgres", {"dsn": database_url, "inbox_table": inbox,
                            "sql": "INSERT INTO no_such_table VALUES ($1, $2)"})
    adapter = PostgresInboxEffectAdapter()
    try:
        out = await adapter.perform(i, i.inline, ctx())
    finally:
        await adapter.close()
    assert out.status == "failed" and out.evidence["sqlstate"] == "42P01"
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval(f"SELECT count(*) FROM {inbox}") == 0
    finally:
        await conn.close()


# ---------------------------------------------------------------------- kafka (sqlite path)


async def test_kafka_adapter_on_the_embedded_log_appends_keyed_by_effect_id(tmp_path: Path) -> None:
    lg = open_log(LogConfig("sqlite", str(tmp_path / "log.db"), Topics("t.", 2)))
    await lg.start()
    await lg.ensure_topics()
    try:
        i = intent("kafka", {"topic": "acme.invoices"})
        out = await KafkaEffectAdapter(lg, "m1").perform(i, i.inline, ctx())
        assert out.status == "succeeded"
        recs = await lg.read("acme.invoices", out.evidence["partition"], out.evidence["offset"], 10)
        assert recs[0].key == i.effect_id.encode()
        assert orjson.loads(recs[0].value)["result"] == {"total": 57}
    finally:
        await lg.close()
