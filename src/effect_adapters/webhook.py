"""Webhook effects over HTTP (httpx): idempotent within a retention, optionally queryable.

Request: ``POST <url>`` with JSON ``{effect_id, run_id, attempt, checksum, result}`` and the
header ``Idempotency-Key: <effect_id>`` (the same key on every try, by every runner
instance, for the life of the effect).

Signatures (Standard Webhooks, https://www.standardwebhooks.com). Every try also carries
``webhook-id: <effect_id>`` (the idempotency key) and ``webhook-timestamp: <unix seconds>``
(of THIS try: a retry has a fresh one). With ``signing_secrets`` (``whsec_<base64>``, see
``chronolog.destinations``) it carries ``webhook-signature: v1,<sig> [v1,<sig> ...]``, one
per secret in the configured order: ``sig`` is the base64 of the HMAC-SHA256 of
``<webhook-id>.<webhook-timestamp>.<body>`` keyed with the secret's decoded bytes. The body
is serialized once; the bytes signed are the bytes sent. Nobody configures these three
headers (nor ``Idempotency-Key``): the adapter's win over any of the same name. Evidence
says how many signatures a delivery carried (``signatures``), never a secret.

Tracing (docs/tracing.md). With tracing on, every try also carries the W3C ``traceparent``
(and ``tracestate``) of the effect runner's span of the effect, in the run's trace; they
replace configured headers of the same names.

Config (the operator's webhook destination in the tenants file, see ``chronolog.destinations``;
a schedule adds only its own ``headers``):

* ``url`` (required); ``headers`` (extra headers; never ``Host``, hop-by-hop or framing
  headers); ``signing_secrets`` (optional, a list: every try is signed, see above);
  ``allow_private`` (default false: loopback, private, link-local and other non-public
  addresses are refused — see ``netguard``); ``timeout`` (per request, default 10s);
* ``max_attempts`` (tries per ``perform``, default 4), ``backoff`` (first delay, default
  0.5s, doubling, capped at ``max_backoff`` 10s);
* ``retention`` (default ``24h``): how long the destination remembers an Idempotency-Key;
* ``idempotent`` (default true): set false for a destination that ignores the key;
* ``status_url`` (optional): ``GET <status_url>?key=<effect_id>`` answers
  ``{"status": "done"|"pending"|"not_found"|"failed", "receipt": ...}`` (404 = not found);
  ``status_checks`` (default 5) and ``status_interval`` (default 1s) bound the polling.

Classification of one try:

* 2xx → **succeeded** (evidence: status, receipt from the body's ``receipt``/``receipt_id``/
  ``id`` or the ``Receipt-Id``/``X-Receipt-Id`` header, elapsed_ms);
* 408, 409, 425, 429 → not processed / in progress: tried again (same key);
* any other 4xx, and any 3xx (redirects are never followed) → **failed** (permanent);
* the URL resolves to an address the destination may not reach → **failed**, nothing sent;
* connection refused / connect timeout → the request never left: tried again;
* read timeout, connection reset or closed before the response, or 5xx → *ambiguous*: the
  destination may have committed the effect. With a ``status_url`` the runner asks (bounded):
  ``done`` → succeeded, ``failed`` → failed; ``pending``/``not_found`` → undecided.

Contract and guarantee. With ``idempotent`` (the default) an undecided effect is re-sent
with the SAME key — but only while ``now + timeout < intended_at + retention``: the
destination first saw the key no earlier than the intent was recorded, so within that bound
it still remembers it. Past the retention nothing is re-sent blindly: with a ``status_url``
an authoritative ``done`` still settles it, otherwise the outcome is **uncertain** (the run
goes to reconciliation). Without idempotency (``idempotent: false``) an ambiguous try is
never repeated: the status URL may settle it, otherwise uncertain. Exactly one external
effect therefore holds only if the destination honours the key as declared; a first try
after a runner crash may repeat a try the crashed instance made, which the key absorbs.
The retention bound compares the runner's clock with the processor's authority time of the
intent: clock skew between them eats into the safety margin (one request timeout).

Evidence never carries the response body or headers: the status code, a receipt ID only when
it is a short token (``[A-Za-z0-9_.:-]``, at most 64 characters), the body's size, timings.
At most ``CHRONOLOG_EFFECT_MAX_RESPONSE_BYTES`` (default 1 MiB) of a response body is read;
a longer body is cut there (``body_truncated`` in the evidence) and its status still counts —
a 2xx is a delivery whatever follows it. JSON is parsed in a thread, never on the event loop,
by a parser that refuses nesting deeper than 1,024 levels (then the body is simply not JSON).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from chronolog.backoff import Backoff
from chronolog.destinations import SIGNATURE_HEADERS, signing_key
from chronolog.domain import messages as m
from chronolog.effect_adapters.base import Contract, EffectContext, Outcome, Stopwatch, seconds
from chronolog.effect_adapters.netguard import BlockedAddress, guarded_client
from chronolog.settings import effect_response_cap
from chronolog.telemetry import tracing

RETRYABLE_4XX = frozenset({408, 409, 425, 429})
DEFAULT_RETENTION = 24 * 3600.0
# never sent, whoever configured them: routing, framing and hop-by-hop headers
NEVER_SENT_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection",
                                "keep-alive", "te", "trailer", "upgrade", "idempotency-key",
                                "accept-encoding"}) | SIGNATURE_HEADERS
_TOKEN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def _token(value: Any) -> str | None:
    """A receipt ID fit for evidence: a short token, else nothing."""
    text = str(value) if isinstance(value, (str, int)) else ""
    return text if _TOKEN.match(text) else None


@dataclass(frozen=True)
class Reply:
    """A destination's answer with at most ``cap`` bytes of its body read."""

    status_code: int
    headers: httpx.Headers
    body: bytes
    truncated: bool  # the body was longer than the cap: the rest was never read

    def evidence(self) -> dict[str, Any]:
        return {"body_bytes": len(self.body), "body_truncated": True} if self.truncated \
            else {"body_bytes": len(self.body)}


async def exchange(client: httpx.AsyncClient, method: str, url: str, cap: int,
                   **kwargs: Any) -> Reply:
    """Send one request and read at most ``cap`` bytes of the response body: a destination
    cannot make the runner hold more than that in memory, whatever it sends. The bytes are
    counted as they come off the wire (``aiter_raw``) and an uncompressed answer is asked
    for (``Accept-Encoding: identity``): a compressed body could otherwise inflate far past
    the cap inside one chunk."""
    headers = {**kwargs.pop("headers", {}), "Accept-Encoding": "identity"}
    async with client.stream(method, url, headers=headers, **kwargs) as resp:
        chunks: list[bytes] = []
        size = 0
        truncated = False
        async for chunk in resp.aiter_raw():
            if size + len(chunk) > cap:
                chunks.append(chunk[:cap - size])
                truncated = True
                break
            chunks.append(chunk)
            size += len(chunk)
        return Reply(resp.status_code, resp.headers, b"".join(chunks), truncated)


async def parse_json(body: bytes) -> Any:
    """The JSON value of a response body, parsed off the event loop; ``None`` when it is not
    JSON, is cut short, or nests deeper than the parser's limit (1,024 levels)."""
    if not body:
        return None
    try:
        return await asyncio.to_thread(orjson.loads, body)
    except orjson.JSONDecodeError:
        return None


async def _receipt(reply: Reply) -> str | None:
    for h in ("Receipt-Id", "X-Receipt-Id"):
        if h in reply.headers:
            return _token(reply.headers[h])
    body = None if reply.truncated else await parse_json(reply.body)
    if isinstance(body, dict):
        for k in ("receipt", "receipt_id", "id"):
            if k in body:
                return _token(body[k])
    return None


def url_refusal(url: Any) -> str | None:
    """Why ``url`` cannot be requested at all (so nothing would be sent), or None."""
    try:
        parsed = httpx.URL(str(url))
    except (httpx.InvalidURL, TypeError) as exc:
        return f"is not a valid URL ({exc})"
    if parsed.scheme not in ("http", "https"):
        return f"is not an http(s) URL (scheme {parsed.scheme!r})"
    if not parsed.host:
        return "has no host"
    return None


def request_headers(cfg: dict[str, Any], effect_id: str) -> dict[str, str]:
    """The configured headers minus the ones never sent, plus the idempotency key and a JSON
    content type (unless one is configured)."""
    headers = {str(k): str(v) for k, v in (cfg.get("headers") or {}).items()
               if str(k).lower() not in NEVER_SENT_HEADERS}
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    return {**headers, "Idempotency-Key": effect_id}


def signing_keys(cfg: dict[str, Any]) -> list[bytes]:
    """The HMAC keys of the configured ``signing_secrets`` (``SecretStr`` or text), in order;
    ``ValueError`` (never showing a secret) for one that is not ``whsec_<base64>``."""
    secrets = cfg.get("signing_secrets") or []
    if not isinstance(secrets, (list, tuple)):
        raise ValueError("signing_secrets must be a list")
    return [signing_key(s) for s in secrets]


def signature(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256>`` of
    ``<msg_id>.<timestamp>.<body>`` for each key, space-separated."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join("v1," + base64.b64encode(hmac.digest(k, signed, hashlib.sha256)).decode()
                    for k in keys)


def signed_headers(headers: dict[str, str], keys: Sequence[bytes], msg_id: str,
                   body: bytes, now: float | None = None) -> dict[str, str]:
    """``headers`` plus ``webhook-id``, ``webhook-timestamp`` (``now``, default the clock,
    in whole seconds) and, with keys, ``webhook-signature``: one try's headers."""
    timestamp = int(time.time() if now is None else now)
    out = {**headers, "webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if keys:
        out["webhook-signature"] = signature(keys, msg_id, timestamp, body)
    return out


class WebhookEffectAdapter:
    """POST with ``Idempotency-Key``; contract ``idempotent`` (or ``queryable``/``none``)."""

    kind = "webhook"

    def __init__(self, max_response_bytes: int | None = None) -> None:
        self._clients: dict[bool, httpx.AsyncClient] = {}  # by allow_private
        self.max_response_bytes = max_response_bytes or effect_response_cap()

    def contract_for(self, config: dict[str, Any]) -> Contract:
        if config.get("idempotent", True):
            return "idempotent"
        return "queryable" if config.get("status_url") else "none"

    @property
    def contract(self) -> Contract:
        return "idempotent"  # the default configuration; see contract_for(config)

    def _http(self, cfg: dict[str, Any]) -> httpx.AsyncClient:
        allow_private = cfg.get("allow_private") is True
        client = self._clients.get(allow_private)
        if client is None:
            client = self._clients[allow_private] = guarded_client(allow_private)
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    # ------------------------------------------------------------------ perform

    async def perform(
        self, intent: m.EffectIntended, payload: Any, ctx: EffectContext | None = None
    ) -> Outcome:
        cfg = intent.config
        url = cfg.get("url")
        if not url:
            return Outcome.failed(reason="config: url is required")
        unusable = url_refusal(url)
        if unusable is not None:  # refused before anything was sent: a failure, not a doubt
            return Outcome.failed(reason=f"config: url {unusable}", sent=False)
        timeout = seconds(cfg.get("timeout"), 10.0)
        retention = seconds(cfg.get("retention"), DEFAULT_RETENTION)
        idempotent = bool(cfg.get("idempotent", True))
        max_attempts = max(1, int(cfg.get("max_attempts", 4)))
        waits = Backoff(first=seconds(cfg.get("backoff"), 0.5),
                        cap=seconds(cfg.get("max_backoff"), 10.0)).delays()
        status_url = cfg.get("status_url")
        try:
            keys = signing_keys(cfg)
        except ValueError as exc:  # the message never shows a secret
            return Outcome.failed(reason=f"config: signing_secrets: {exc}", sent=False)
        # serialized once: the bytes signed are the bytes sent, on every try
        body = orjson.dumps({"effect_id": intent.effect_id, "run_id": intent.run_id,
                             "attempt": intent.attempt, "checksum": intent.checksum,
                             "result": payload})
        headers = request_headers(cfg, intent.effect_id)
        if tracing.enabled:  # the effect runner's span of this effect (docs/tracing.md)
            context = tracing.http_headers()
            headers = {k: v for k, v in headers.items() if k.lower() not in context} | context
        sw = Stopwatch()
        tries: list[dict[str, Any]] = []
        ambiguous = False
        base: dict[str, Any] = {"idempotency_key": intent.effect_id,
                                "contract": self.contract_for(cfg)}
        if keys:
            base["signatures"] = len(keys)

        for n in range(1, max_attempts + 1):
            if n > 1:
                await asyncio.sleep(next(waits))
            if idempotent:
                if ctx is not None and ctx.age() + timeout >= retention:
                    return await self._past_retention(intent, cfg, base, tries, sw, retention)
            elif ambiguous:
                break  # never repeat an ambiguous try without idempotency
            t = Stopwatch()
            try:
                resp = await exchange(
                    self._http(cfg), "POST", url, self.max_response_bytes, content=body,
                    headers=signed_headers(headers, keys, intent.effect_id, body),
                    timeout=timeout)
            except BlockedAddress as exc:
                return Outcome.failed(**base, reason=f"destination refused: {exc}", tries=tries,
                                      elapsed_ms=sw.ms())
            except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # before any byte
                return Outcome.failed(**base, reason=f"config: url {exc}", sent=False,
                                      tries=tries, elapsed_ms=sw.ms())
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                tries.append({"try": n, "error": type(exc).__name__, "sent": False,
                              "elapsed_ms": t.ms()})
                continue
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                tries.append({"try": n, "error": type(exc).__name__, "sent": "maybe",
                              "elapsed_ms": t.ms()})
                ambiguous = True
            else:
                tries.append({"try": n, "status": resp.status_code, "elapsed_ms": t.ms()})
                tries[-1].update(resp.evidence())
                if 200 <= resp.status_code < 300:
                    return Outcome.succeeded(**base, status=resp.status_code,
                                             receipt=await _receipt(resp), tries=tries,
                                             elapsed_ms=sw.ms())
                if 300 <= resp.status_code < 400:
                    return Outcome.failed(**base, status=resp.status_code,
                                          reason="redirects are not followed", tries=tries,
                                          elapsed_ms=sw.ms())
                if 400 <= resp.status_code < 500 and resp.status_code not in RETRYABLE_4XX:
                    return Outcome.failed(**base, status=resp.status_code,
                                          body_bytes=len(resp.body), tries=tries,
                                          elapsed_ms=sw.ms())
                if resp.status_code >= 500:
                    ambiguous = True
            if ambiguous and status_url:
                settled = await self._ask(intent, cfg, base, tries, sw)
                if settled is not None:
                    return settled

        if not ambiguous:
            return Outcome.retry_later(**base, reason="destination unavailable; nothing sent "
                                       "or nothing processed", tries=tries, elapsed_ms=sw.ms())
        if idempotent:
            return Outcome.retry_later(**base, reason="ambiguous; safe to repeat with the same "
                                       "key within the retention", tries=tries,
                                       elapsed_ms=sw.ms())
        return Outcome.uncertain(**base, reason="ambiguous outcome and the destination does not "
                                 "deduplicate", tries=tries, elapsed_ms=sw.ms())

    async def _past_retention(
        self, intent: m.EffectIntended, cfg: dict[str, Any], base: dict[str, Any],
        tries: list[dict[str, Any]], sw: Stopwatch, retention: float,
    ) -> Outcome:
        if cfg.get("status_url"):
            settled = await self._ask(intent, cfg, base, tries, sw)
            if settled is not None:
                return settled
        return Outcome.uncertain(**base, reason=f"idempotency retention ({retention:g}s) elapsed; "
                                 "a repeat could duplicate the effect", tries=tries,
                                 elapsed_ms=sw.ms())

    async def _ask(
        self, intent: m.EffectIntended, cfg: dict[str, Any], base: dict[str, Any],
        tries: list[dict[str, Any]], sw: Stopwatch,
    ) -> Outcome | None:
        """Poll the status URL (bounded): an Outcome when it is authoritative, else None."""
        checks = max(1, int(cfg.get("status_checks", 5)))
        interval = seconds(cfg.get("status_interval"), 1.0)
        timeout = seconds(cfg.get("timeout"), 10.0)
        seen: list[str] = []
        for i in range(checks):
            if i:
                await asyncio.sleep(interval)
            try:
                resp = await exchange(self._http(cfg), "GET", cfg["status_url"],
                                      self.max_response_bytes,
                                      params={"key": intent.effect_id}, timeout=timeout)
            except (httpx.HTTPError, BlockedAddress) as exc:
                seen.append(type(exc).__name__)
                continue
            if resp.status_code == 404:
                seen.append("not_found")
                continue
            doc = None if resp.truncated else await parse_json(resp.body)
            if doc is None:
                seen.append(f"http {resp.status_code}")
                continue
            status = str(doc.get("status", "")) if isinstance(doc, dict) else ""
            seen.append(status if status in ("done", "failed", "pending", "not_found")
                        else f"http {resp.status_code}")
            if status == "done":
                return Outcome.succeeded(**base, via="status_url",
                                         receipt=_token(doc.get("receipt")),
                                         status_checks=seen, tries=tries, elapsed_ms=sw.ms())
            if status == "failed":
                return Outcome.failed(**base, via="status_url", status_checks=seen,
                                      tries=tries, elapsed_ms=sw.ms())
        tries.append({"status_checks": seen})
        return None
