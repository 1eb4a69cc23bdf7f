"""Real destinations on loopback for effect tests: an HTTP server and an SMTP server.

``HookServer`` is a tiny asyncio HTTP/1.1 server (one request per connection). ``POST /hook``
commits an effect; with ``dedup`` it deduplicates by ``Idempotency-Key`` (a repeated key
returns the stored receipt and commits nothing). ``plan`` scripts the next POSTs:

* ``ok`` — commit, answer 200 ``{"receipt": ...}``;
* ``drop`` — commit, then close the connection without answering (a lost response);
* ``500`` — commit, then answer 500 (the effect happened; the reply says error);
* ``503`` — answer 503 WITHOUT committing;
* ``400`` — answer 400 without committing (its body carries ``secret`` text);
* ``redirect`` — answer 307 to ``redirect_to`` without committing;
* ``huge`` — commit, answer 200 with a body of ``huge_bytes`` (default 64 MiB, streamed);
* ``deep`` — commit, answer 200 with 200,000 nested ``[`` (no JSON parser's recursion copes).

Every request's path and headers are kept in ``requests`` (to see what reached the server).

``GET /status?key=K`` answers ``{"status": "done", "receipt": ...}`` or 404 ``not_found``
(with ``status_deep``: 200 and 200,000 nested ``[``).

``SmtpServer`` is an aiosmtpd ``Controller`` on 127.0.0.1 whose handler records every message
it receives and can drop the reply after DATA (``drop_after_data`` counts down): the message
is recorded — the server has it — then the connection is closed before the 250 reply.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs, urlparse

import orjson
from aiosmtpd.controller import Controller

from support.net import free_port


class HookServer:
    """An HTTP destination that (optionally) deduplicates by Idempotency-Key."""

    def __init__(self, dedup: bool = True) -> None:
        self.dedup = dedup
        self.plan: list[str] = []
        self.keys_seen: list[str] = []  # the Idempotency-Key of every POST received
        self.committed: list[dict[str, Any]] = []  # one entry per committed effect
        self.receipts: dict[str, str] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []  # (method path, headers)
        self.redirect_to = ""
        self.secret = "s3cret-internal-token"
        self.huge_bytes = 64 << 20
        self.huge_sent = 0  # bytes of huge bodies the server managed to write
        self.status_deep = False  # GET /status answers 200 with 200,000 nested ``[``
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/status"

    async def start(self) -> HookServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode()
            if not line:
                return
            method, target, _ = line.split(" ", 2)
            headers: dict[str, str] = {}
            while True:
                h = (await reader.readline()).decode().strip()
                if not h:
                    break
                k, _, v = h.partition(":")
                headers[k.strip().lower()] = v.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((f"{method} {target}", headers))
            url = urlparse(target)
            if method == "GET" and url.path == "/status":
                key = parse_qs(url.query).get("key", [""])[0]
                if self.status_deep:
                    self._deep(writer)
                elif key in self.receipts:
                    self._respond(writer, 200, {"status": "done", "receipt": self.receipts[key]})
                else:
                    self._respond(writer, 404, {"status": "not_found"})
            elif method == "POST" and url.path == "/hook":
                await self._post(writer, headers.get("idempotency-key", ""), body)
            else:
                self._respond(writer, 404, {"error": "no route"})
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _post(self, writer: asyncio.StreamWriter, key: str, body: bytes) -> None:
        action = self.plan.pop(0) if self.plan else "ok"
        self.keys_seen.append(key)
        if action == "503":
            self._respond(writer, 503, {"error": "unavailable"})
            return
        if action == "400":
            self._respond(writer, 400, {"error": "bad request", "detail": self.secret})
            return
        if action == "redirect":
            writer.write(f"HTTP/1.1 307 X\r\nLocation: {self.redirect_to}\r\n"
                         "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
            return
        if self.dedup and key in self.receipts:
            receipt = self.receipts[key]
        else:
            receipt = f"receipt_{900 + len(self.committed)}"
            self.committed.append({"key": key, "body": orjson.loads(body), "receipt": receipt})
            if self.dedup:
                self.receipts[key] = receipt
        if action == "drop":
            writer.transport.abort()  # committed, but the response is lost
            return
        if action == "huge":
            await self._huge(writer)
            return
        if action == "deep":
            self._deep(writer)
            return
        if action == "500":
            self._respond(writer, 500, {"error": "internal"})
            return
        self._respond(writer, 200, {"receipt": receipt})

    @staticmethod
    def _deep(writer: asyncio.StreamWriter) -> None:
        data = b"[" * 200_000
        writer.write(f"HTTP/1.1 200 X\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                     + data)

    async def _huge(self, writer: asyncio.StreamWriter) -> None:
        """200 and ``huge_bytes`` of body, written in chunks until the client stops reading."""
        chunk = b"x" * (64 << 10)
        writer.write(f"HTTP/1.1 200 X\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {self.huge_bytes}\r\nConnection: close\r\n\r\n"
                     .encode())
        for _ in range(self.huge_bytes // len(chunk)):
            writer.write(chunk)
            await writer.drain()
            self.huge_sent += len(chunk)

    @staticmethod
    def _respond(writer: asyncio.StreamWriter, status: int, doc: dict[str, Any]) -> None:
        data = orjson.dumps(doc)
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)


class _Handler:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.drop_after_data = 0
        self.refuse: set[str] = set()

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        if address in self.refuse:
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope.original_content or envelope.content)
        if self.drop_after_data > 0:
            self.drop_after_data -= 1
            server.transport.abort()  # the server has the message; the reply is lost
            return "250 OK (never sent)"
        return "250 2.0.0 queued as Q" + str(len(self.messages))


class SmtpServer:
    """A real aiosmtpd server on 127.0.0.1 (in its own thread)."""

    def __init__(self) -> None:
        self.handler = _Handler()
        self.port = free_port()
        self.controller = Controller(self.handler, hostname="127.0.0.1", port=self.port)

    def start(self) -> SmtpServer:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()

    @property
    def messages(self) -> list[bytes]:
        return self.handler.messages
