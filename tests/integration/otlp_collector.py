"""A small OTLP/HTTP trace receiver and a webhook receiver for the tracing tests.

``Collector`` answers ``POST /v1/traces`` as an OpenTelemetry collector does: it decodes
each ``ExportTraceServiceRequest`` (protobuf, optionally gzip) and keeps its spans, flattened
with their resource's ``service.name``. ``Hooks`` answers every POST 200 with a receipt and
keeps the request's headers. Both serve from a thread, so processes export to them while the
test's event loop waits.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Span:
    """One exported span; IDs in lower-case hex, ``parent`` empty for a root."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent: str
    links: tuple[tuple[str, str], ...]
    attributes: dict[str, Any] = field(hash=False)
    error: bool = False


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest``."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out: list[Span] = []
    for rs in req.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append(Span(
                    service=str(resource.get("service.name", "")), name=sp.name, kind=sp.kind,
                    trace_id=sp.trace_id.hex(), span_id=sp.span_id.hex(),
                    parent=sp.parent_span_id.hex(),
                    links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in sp.links),
                    attributes={a.key: _value(a.value) for a in sp.attributes},
                    error=sp.status.code == 2))  # STATUS_CODE_ERROR
    return out


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.owner = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _OtlpHandler(_Handler):
    def do_POST(self) -> None:
        owner: Collector = self.server.owner  # type: ignore[attr-defined]
        body = self._body()
        if self.path != "/v1/traces":
            self._answer(404, b"", "text/plain")
            return
        spans = decode(body)
        with owner._lock:
            owner.requests += 1
            owner.spans.extend(spans)
        self._answer(200, ExportTraceServiceResponse().SerializeToString(),
                     "application/x-protobuf")


class Collector(_Server):
    """An OTLP/HTTP receiver on 127.0.0.1: ``endpoint`` is its base URL."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        super().__init__(_OtlpHandler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)


class _HookHandler(_Handler):
    def do_POST(self) -> None:
        owner: Hooks = self.server.owner  # type: ignore[attr-defined]
        self._body()
        with owner._lock:
            owner.deliveries.append({k.lower(): v for k, v in self.headers.items()})
            n = len(owner.deliveries)
        self._answer(200, b'{"receipt": "r%d"}' % n, "application/json")


class Hooks(_Server):
    """A webhook destination on 127.0.0.1 that keeps every delivery's headers."""

    def __init__(self) -> None:
        self.deliveries: list[dict[str, str]] = []
        super().__init__(_HookHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def snapshot(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self.deliveries)
