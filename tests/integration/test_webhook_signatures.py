"""Signed webhooks (Standard Webhooks), verified by the official library (``standardwebhooks``).

Real parts: chronolog's webhook adapter — and, once, a processor and an effect runner on the
embedded log — delivers to a real HTTP server on loopback (the destination allows private
addresses), which keeps each request's headers and raw body bytes exactly as they arrived;
the library verifies them as a receiver would. Covered: a delivery verifies; with two
secrets (a rotation) either verifies alone; a delivery presented later than the library's
tolerance (its clock moved forward 5 minutes) is refused, as are a changed body or ID; a
retry after a 503 has the same ``webhook-id``, a new timestamp and a valid signature; no
configured header replaces the adapter's; the receiver example of docs/deployment.md
("Signed webhooks") runs against real deliveries; and no secret reaches the log, the
evidence or the process's log lines.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import standardwebhooks.webhooks as swh
import structlog
from standardwebhooks import Webhook, WebhookVerificationError

from chronolog.destinations import adapter_config, parse_destinations
from chronolog.domain import messages as m
from chronolog.effect_adapters.base import EffectContext
from chronolog.effect_adapters.webhook import WebhookEffectAdapter
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from chronolog.tenants import Tenant, Tenants
from support.docs import doc_blocks
from support.logs import started
from support.polling import wait_until

from .conftest import ROOT

NEW = "whsec_" + base64.b64encode(hashlib.sha256(b"new secret").digest()).decode()
OLD = "whsec_" + base64.b64encode(hashlib.sha256(b"old secret").digest()[:24]).decode()
OTHER = "whsec_" + base64.b64encode(hashlib.sha256(b"someone else").digest()).decode()


@dataclass
class Delivery:
    """One request as it reached the receiver: its headers (lower-case names) and raw body."""

    headers: dict[str, str]
    body: bytes
    received_at: float  # the receiver's clock, Unix seconds


class Receiver:
    """An HTTP/1.1 server on 127.0.0.1 (one request per connection) that keeps every POST's
    headers and raw body and answers what ``plan`` says (``503``), else 200 with a receipt."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.plan: list[str] = []
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> Receiver:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not (await reader.readline()):
                return
            headers: dict[str, str] = {}
            while (line := (await reader.readline()).decode().strip()):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.deliveries.append(Delivery(headers, body, time.time()))
            status = 503 if self.plan and self.plan.pop(0) == "503" else 200
            doc = orjson.dumps({"receipt": f"r{len(self.deliveries)}"})
            writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(doc)}\r\nConnection: close\r\n\r\n".encode()
                         + doc)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    srv = await Receiver().start()
    yield srv
    await srv.close()


def config(url: str, secrets: list[str], **table: Any) -> dict[str, Any]:
    """The adapter's config of a tenants-file webhook destination, as the runner builds it."""
    dest = parse_destinations("acme", {"d": {
        "kind": "webhook", "url": url, "allow_private": True, "timeout": "3s",
        "backoff": "10ms", "signing_secrets": secrets, **table}})["d"]
    return adapter_config(dest, {})


def intent(cfg: dict[str, Any]) -> m.EffectIntended:
    run_id = f"r_{uuid.uuid4().hex[:12]}"
    return m.EffectIntended(effect_id=f"webhook-{run_id}", run_id=run_id, kind="webhook",
                            config=cfg, checksum="c1", inline={"total": 57, "name": "Zoë"},
                            attempt=1)


def ctx() -> EffectContext:
    return EffectContext(tenant="acme", schedule_id="s1", intended_at=datetime.now(UTC))


async def deliver(cfg: dict[str, Any]) -> tuple[m.EffectIntended, Any]:
    i = intent(cfg)
    adapter = WebhookEffectAdapter()
    try:
        return i, await adapter.perform(i, i.inline, ctx())
    finally:
        await adapter.close()


@pytest.fixture
def clock_ahead(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[timedelta]]:
    """The library's clock moved forward by ``ahead[0]``: its ``datetime.now`` (the one it
    compares ``webhook-timestamp`` with) is the real time plus that."""
    ahead = [timedelta(0)]

    class Later(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + ahead[0]

    monkeypatch.setattr(swh, "datetime", Later)
    yield ahead


def refusal(secret: str, d: Delivery, body: bytes | None = None,
            **headers: str) -> str | None:
    """The library's reason to refuse ``d`` (with ``body``/``headers`` changed), or None."""
    try:
        Webhook(secret).verify(d.body if body is None else body, {**d.headers, **headers})
    except WebhookVerificationError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------- the adapter


async def test_the_library_verifies_a_delivery_whose_signed_bytes_are_the_body_sent(
        receiver: Receiver) -> None:
    i, out = await deliver(config(receiver.url, [NEW]))
    assert out.status == "succeeded" and out.evidence["signatures"] == 1
    [d] = receiver.deliveries
    expected = {"effect_id": i.effect_id, "run_id": i.run_id, "attempt": 1, "checksum": "c1",
                "result": {"total": 57, "name": "Zoë"}}
    assert Webhook(NEW).verify(d.body, d.headers) == expected
    assert d.body == orjson.dumps(expected)  # serialized once: these bytes were signed
    assert d.headers["content-type"] == "application/json"
    assert d.headers["webhook-id"] == d.headers["idempotency-key"] == i.effect_id
    assert abs(int(d.headers["webhook-timestamp"]) - d.received_at) <= 1.5
    assert d.headers["webhook-signature"].startswith("v1,")
    assert " " not in d.headers["webhook-signature"]  # one secret, one signature
    assert NEW[6:] not in str(out.evidence)


async def test_with_two_secrets_either_one_alone_verifies(receiver: Receiver) -> None:
    i, out = await deliver(config(receiver.url, [NEW, OLD]))
    assert out.status == "succeeded" and out.evidence["signatures"] == 2
    [d] = receiver.deliveries
    assert len(d.headers["webhook-signature"].split(" ")) == 2
    assert refusal(NEW, d) is None  # a receiver already switched to the new secret
    assert refusal(OLD, d) is None  # a receiver still on the old one
    assert refusal(OTHER, d) == "No matching signature found"
    assert Webhook(OLD).verify(d.body, d.headers)["effect_id"] == i.effect_id


async def test_a_delivery_presented_after_the_tolerance_is_refused(
        receiver: Receiver, clock_ahead: list[timedelta]) -> None:
    await deliver(config(receiver.url, [NEW]))
    [d] = receiver.deliveries
    assert refusal(NEW, d) is None
    clock_ahead[0] = timedelta(minutes=4, seconds=50)  # within the 5 minutes
    assert refusal(NEW, d) is None
    clock_ahead[0] = timedelta(minutes=5, seconds=5)  # the same bytes, replayed later
    assert refusal(NEW, d) == "Message timestamp too old"
    # nor can the replayer refresh the timestamp: the signature covers it
    assert refusal(NEW, d, **{"webhook-timestamp": str(int(time.time()) + 300)}) \
        == "No matching signature found"


async def test_a_changed_body_id_or_missing_signature_is_refused(receiver: Receiver) -> None:
    await deliver(config(receiver.url, [NEW, OLD]))
    [d] = receiver.deliveries
    tampered = d.body.replace(b'"total":57', b'"total":58')
    assert tampered != d.body
    for secret in (NEW, OLD):
        assert refusal(secret, d, tampered) == "No matching signature found"
        assert refusal(secret, d, d.body + b" ") == "No matching signature found"
        assert refusal(secret, d, **{"webhook-id": "webhook-r_other"}) \
            == "No matching signature found"
    unsigned = {k: v for k, v in d.headers.items() if k != "webhook-signature"}
    with pytest.raises(WebhookVerificationError, match="Missing required headers"):
        Webhook(NEW).verify(d.body, unsigned)


async def test_a_retry_after_a_503_has_the_same_id_a_new_timestamp_and_a_valid_signature(
        receiver: Receiver) -> None:
    receiver.plan = ["503"]
    # the first retry waits backoff (1.1 s): its timestamp is a later second
    i, out = await deliver(config(receiver.url, [NEW, OLD], backoff="1100ms"))
    assert out.status == "succeeded"
    assert [t["status"] for t in out.evidence["tries"]] == [503, 200]
    first, retry = receiver.deliveries
    assert first.headers["webhook-id"] == retry.headers["webhook-id"] == i.effect_id
    assert retry.headers["idempotency-key"] == i.effect_id
    assert int(retry.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    for d in (first, retry):
        assert abs(int(d.headers["webhook-timestamp"]) - d.received_at) <= 1.5
    assert retry.headers["webhook-signature"] != first.headers["webhook-signature"]
    assert retry.body == first.body  # the same delivery, signed again
    for secret in (NEW, OLD):
        assert refusal(secret, first) is None and refusal(secret, retry) is None
    # the retry's signature does not fit the first try's timestamp, nor the reverse
    assert refusal(NEW, retry, **{"webhook-timestamp": first.headers["webhook-timestamp"]}) \
        == "No matching signature found"


async def test_without_secrets_a_delivery_has_the_id_and_time_but_no_signature(
        receiver: Receiver) -> None:
    i, out = await deliver(config(receiver.url, []))
    assert out.status == "succeeded" and "signatures" not in out.evidence
    [d] = receiver.deliveries
    assert "webhook-signature" not in d.headers
    assert d.headers["webhook-id"] == i.effect_id
    assert abs(int(d.headers["webhook-timestamp"]) - d.received_at) <= 1.5
    assert refusal(NEW, d) == "Missing required headers"
    assert orjson.loads(d.body)["effect_id"] == i.effect_id


async def test_no_configured_header_replaces_the_adapters_own(receiver: Receiver) -> None:
    cfg = config(receiver.url, [NEW])
    # a config that bypassed the tenants file's validation (the headers are refused there)
    cfg["headers"] = {"Webhook-Signature": "v1,forged", "webhook-id": "someone-else",
                      "WEBHOOK-TIMESTAMP": "1", "X-Trace": "t"}
    i, out = await deliver(cfg)
    assert out.status == "succeeded"
    [d] = receiver.deliveries
    assert d.headers["webhook-id"] == i.effect_id and d.headers["x-trace"] == "t"
    assert "forged" not in d.headers["webhook-signature"]
    assert refusal(NEW, d) is None


async def test_a_bad_secret_in_a_config_fails_before_sending_and_is_not_shown(
        receiver: Receiver) -> None:
    cfg = config(receiver.url, [])
    cfg["signing_secrets"] = ["whsec_c2hvcnQ="]  # 5 bytes, bypassing the tenants file
    _, out = await deliver(cfg)
    assert out.status == "failed" and out.evidence["sent"] is False
    assert "signing_secrets" in out.evidence["reason"] and "c2hvcnQ" not in str(out.evidence)
    assert receiver.deliveries == []


async def test_the_receiver_example_of_the_deployment_guide_verifies_real_deliveries(
        receiver: Receiver, clock_ahead: list[timedelta]) -> None:
    [block] = [b for b in doc_blocks(ROOT, "docs/deployment.md")
               if b.heading == "Signed webhooks" and b.kind == "python"]
    example: dict[str, Any] = {}
    exec(compile(block.text, "docs/deployment.md", "exec"), example)  # the reader's program
    [secret] = re.findall(r'"(whsec_[^"]+)"', block.text)  # the receiver's own secret
    # the destination's secrets: a new one being rolled out, and the receiver's
    i, _ = await deliver(config(receiver.url, [NEW, secret]))
    [d] = receiver.deliveries
    receive = example["receive"]
    assert receive(d.body, d.headers) == 200
    assert example["done"] == {i.effect_id}
    assert receive(d.body, d.headers) == 200 and example["done"] == {i.effect_id}  # once
    assert receive(d.body.replace(b"57", b"58"), d.headers) == 401
    clock_ahead[0] = timedelta(minutes=6)
    assert receive(d.body, d.headers) == 401  # replayed late
    clock_ahead[0] = timedelta(0)
    await deliver(config(receiver.url, [NEW]))  # not signed with the receiver's secret
    assert receive(receiver.deliveries[-1].body, receiver.deliveries[-1].headers) == 401
    assert len(example["done"]) == 1


# ------------------------------------------------------------ processor + effect runner


@pytest.fixture
async def embedded_log(tmp_path: Path) -> AsyncIterator[Any]:
    cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(partitions=2))
    async with started(open_log(cfg)) as lg:
        yield lg


async def test_the_effect_runner_delivers_signed_webhooks_and_no_secret_is_recorded(
        receiver: Receiver, embedded_log: Any) -> None:
    from .test_effect_scenarios import SCHEDULE, TENANT, Stack, all_events, of_type

    receiver.plan = ["503"]  # the runner's first try: unavailable, then tried again
    tenants = Tenants({TENANT: Tenant(TENANT, (), None, None, parse_destinations(TENANT, {
        "hook": {"kind": "webhook", "url": receiver.url, "allow_private": True,
                 "timeout": "3s", "backoff": "1100ms", "signing_secrets": [NEW, OLD]}}))})
    spec = {"at": "2099-01-01T00:00:00Z", "job": {"type": "invoice"},
            "effects": [{"kind": "webhook", "destination": "hook",
                         "headers": {"X-Trace": "nightly"}}]}
    with structlog.testing.capture_logs() as logs:
        async with Stack(embedded_log) as s:
            await s.client.create_schedule(TENANT, SCHEDULE, spec)
            fx, task = await s.runner("fx1", tenants=tenants)
            run_id = await s.quick_run("k1")
            effect_id = f"webhook-{run_id}"

            async def succeeded() -> list[Any]:
                return of_type(await all_events(embedded_log), "EffectSucceeded",
                               effect_id=effect_id)

            [ok] = await wait_until(succeeded, 30, what="signed webhook delivered")
            await s.stop(fx, task)
            evs = await all_events(embedded_log)

    first, retry = receiver.deliveries
    for d in (first, retry):
        for secret in (NEW, OLD):
            assert Webhook(secret).verify(d.body, d.headers)["result"] == {"marker": "k1"}
        assert d.headers["webhook-id"] == d.headers["idempotency-key"] == effect_id
        assert d.headers["x-trace"] == "nightly"
    assert int(retry.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    assert ok.evidence["signatures"] == 2
    # the secrets are nowhere in the log (intents, outcomes, evidence) nor in a log line
    recorded = orjson.dumps([e.model_dump(mode="json") for e in evs]).decode()
    lines = repr(logs)
    assert any(e.get("event") == "effect_outcome" and e.get("effect_id") == effect_id
               for e in logs)  # the runner's log lines were captured
    for secret in (NEW, OLD):
        assert secret[6:] not in recorded and secret[6:] not in lines
        assert secret[6:20] not in recorded and secret[6:20] not in lines
