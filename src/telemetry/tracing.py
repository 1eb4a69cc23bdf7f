"""Tracing: the switch, the spans of a run and the W3C trace context on records and requests.

Off unless the standard OpenTelemetry environment asks for it (``requested``): then
``configure_tracing`` installs the SDK's tracer provider (``chronolog.telemetry.setup``) and
sets ``enabled``. Every call site checks ``enabled`` first, so with tracing off the run path
builds no span, no context and no header.

The spans (docs/tracing.md has the picture):

* ``<METHOD> <route>`` (server): an API request (``TracingMiddleware``), a child of the
  caller's ``traceparent`` when the request carries one;
* ``chronolog.decide <CommandType>`` (consumer): a processor's decision of a command whose
  record carries a ``traceparent`` header (``decided``); its parent is that header, it starts
  when the command was appended and ends when it was decided, and it links to the trace of
  every run the decision materialized;
* ``chronolog.occurrence`` (internal): the root of a run's trace (``chronolog.telemetry.ids``),
  written when the run is materialized (``run_event``), linked to the decision span that
  caused it (a manual trigger, a backfill) when there is one;
* ``chronolog.claim``: a claim of the run (an assignment to a worker, or a worker's own);
* ``chronolog.attempt`` (consumer): a worker's attempt, from its start to its outcome
  (``AttemptTrace``), with ``chronolog.handler <job type>`` as a child around the handler,
  which runs with that span as its current context: a handler's own spans are its children;
* ``chronolog.effect <kind>`` (client): the effect runner's delivery of one effect; an
  outgoing webhook carries its ``traceparent``.

Every span of a run but the API request and the decision is in the run's trace, and the
commands a traced process sends (a worker's outcome, the effect runner's) carry its current
span's ``traceparent``, so their decisions join that trace too.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from chronolog.telemetry.ids import root_ids, run_trace_ids

T = TypeVar("T")
Headers = tuple[tuple[str, bytes], ...]
#: a traced command's ID and the link to its decision span
Cause = tuple[str, Link]

#: True once tracing is configured (``configure_tracing``, ``enable``): the one check the run
#: path makes
enabled = False

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: the instrumentation scope of chronolog's own spans
TRACER_NAME = "chronolog"

# span names
DECIDE = "chronolog.decide"
OCCURRENCE = "chronolog.occurrence"
CLAIM = "chronolog.claim"
ATTEMPT = "chronolog.attempt"
HANDLER = "chronolog.handler"
EFFECT = "chronolog.effect"

# attribute names
RUN_ID = "chronolog.run_id"
SCHEDULE_ID = "chronolog.schedule_id"
TENANT = "chronolog.tenant"
COMMAND_TYPE = "chronolog.command.type"
COMMAND_ID = "chronolog.command.id"
DECISION_STATUS = "chronolog.decision.status"
TRIGGER = "chronolog.trigger"
SCHEDULED_AT = "chronolog.scheduled_at"
ATTEMPT_NO = "chronolog.attempt"
FENCE = "chronolog.fence"
WORKER_ID = "chronolog.worker_id"
JOB_TYPE = "chronolog.job_type"
OUTCOME = "chronolog.outcome"
EFFECT_ID = "chronolog.effect.id"
EFFECT_KIND = "chronolog.effect.kind"
EFFECT_DESTINATION = "chronolog.effect.destination"
EFFECT_ATTEMPT = "chronolog.effect.attempt"

_tracer: trace.Tracer = trace.NoOpTracer()
_propagator = TraceContextTextMapPropagator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


# ------------------------------------------------------------------ the switch


def requested(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for tracing: ``OTEL_TRACES_EXPORTER`` (other than
    ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set
    and not empty, and ``OTEL_SDK_DISABLED`` not ``true``."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(exporters or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


def configure_tracing(service_name: str, env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when the environment asks for it (``requested``): the SDK's tracer
    provider, configured by the standard ``OTEL_*`` variables, becomes the global one (so a
    handler's ``trace.get_tracer(...)`` exports through it too) and chronolog's spans are
    made. ``service_name`` is the default ``service.name`` (``OTEL_SERVICE_NAME`` or
    ``OTEL_RESOURCE_ATTRIBUTES`` win). False when tracing stays off. ``ValueError`` for an
    exporter or protocol this build does not have."""
    env = os.environ if env is None else env
    if not requested(env):
        return False
    from chronolog.telemetry.setup import tracer_provider  # the SDK: only when tracing is on

    provider = tracer_provider(service_name, env)
    trace.set_tracer_provider(provider)
    enable(provider)
    return True


def enable(provider: trace.TracerProvider | None = None) -> None:
    """Make chronolog's spans through ``provider`` (default: the global one): for a program
    that sets up OpenTelemetry itself and embeds a ``Worker`` or a ``Client``. Its provider
    should use ``chronolog.telemetry.setup.RunIdGenerator`` so that the occurrence span is
    the root the other spans of a run point at."""
    global enabled, _tracer
    _tracer = trace.get_tracer(TRACER_NAME, tracer_provider=provider)
    enabled = True


def disable() -> None:
    """Stop making spans (tests; a process's tracing normally lasts as long as it does)."""
    global enabled, _tracer
    enabled = False
    _tracer = trace.NoOpTracer()


# ------------------------------------------------------------------ propagation


def run_span_context(run_id: str) -> SpanContext:
    """The span context of a run's root span (remote: whoever asks did not make it)."""
    trace_id, span_id = run_trace_ids(run_id)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=_SAMPLED)


def run_context(run_id: str) -> Context:
    """A context whose current span is the run's root: the parent of a run's spans."""
    return trace.set_span_in_context(NonRecordingSpan(run_span_context(run_id)))


def _inject(context: Context | None) -> dict[str, str]:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=context)
    return carrier


def record_headers(context: Context | None = None) -> Headers:
    """The ``traceparent`` (and ``tracestate``) record headers of ``context`` (default: the
    current one); empty when it has no valid span."""
    return tuple((k, v.encode()) for k, v in _inject(context).items())


def http_headers(context: Context | None = None) -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate``) HTTP headers of ``context`` (default: the
    current one); empty when it has no valid span."""
    return _inject(context)


def run_headers(run_id: str) -> Headers:
    """The record headers that put a command in a run's trace, under its root span."""
    return record_headers(run_context(run_id))


def context_of(headers: Sequence[tuple[str, bytes]]) -> Context | None:
    """The trace context the ``traceparent``/``tracestate`` record headers carry; None
    without a valid ``traceparent``."""
    carrier: dict[str, str] = {}
    for name, value in headers:
        if name in (TRACEPARENT, TRACESTATE):
            try:
                carrier[name] = value.decode("ascii")
            except UnicodeDecodeError:
                return None
    if TRACEPARENT not in carrier:
        return None
    ctx = _propagator.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def context_of_http(headers: Mapping[str, str]) -> Context | None:
    """The trace context of an HTTP request's headers (lower-case names); None without a
    valid ``traceparent``."""
    if TRACEPARENT not in headers:
        return None
    ctx = _propagator.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


# ------------------------------------------------------------------ the processor


def decided(command_type: str, command_id: str, tenant: str, schedule_id: str, status: str,
            events: Sequence[Any], headers: Sequence[tuple[str, bytes]],
            appended_ms: int = 0) -> Cause | None:
    """The span of a command's decision when its record carries a ``traceparent``
    (``headers``), its parent: it starts at ``appended_ms`` (when the command was appended)
    and links to the root of every run the decision materialized (``events``). The cause
    the spans of those runs link back to (``run_event``); None without a ``traceparent``."""
    parent = context_of(headers) if headers else None
    if parent is None:
        return None
    made = [Link(run_span_context(ev.run_id), {RUN_ID: ev.run_id}) for ev in events
            if ev.type == "OccurrenceMaterialized"]
    start = min(appended_ms * 1_000_000, time.time_ns()) if appended_ms > 0 else None
    span = _tracer.start_span(
        f"{DECIDE} {command_type}", context=parent, kind=SpanKind.CONSUMER, links=made,
        start_time=start, attributes={COMMAND_TYPE: command_type, COMMAND_ID: command_id,
                                      TENANT: tenant, SCHEDULE_ID: schedule_id,
                                      DECISION_STATUS: status})
    span.end()
    return command_id, Link(span.get_span_context(), {COMMAND_TYPE: command_type})


def run_event(tenant: str, schedule_id: str, command_id: str, event: Any,
              cause: Cause | None) -> None:
    """The span an event of a run makes, if any: ``chronolog.occurrence`` (the run trace's
    root, linked to ``cause`` when the command ``command_id`` is its) for a materialized run,
    ``chronolog.claim`` for a claim."""
    kind = event.type
    if kind == "OccurrenceMaterialized":
        links = [cause[1]] if cause is not None and cause[0] == command_id else []
        token = root_ids.set(run_trace_ids(event.run_id))
        try:
            span = _tracer.start_span(OCCURRENCE, context=Context(), links=links, attributes={
                RUN_ID: event.run_id, TENANT: tenant, SCHEDULE_ID: schedule_id,
                TRIGGER: event.trigger, SCHEDULED_AT: event.scheduled_at.isoformat(),
                JOB_TYPE: event.job.type, COMMAND_ID: command_id})
        finally:
            root_ids.reset(token)
        span.end()
    elif kind == "AttemptClaimed":
        span = _tracer.start_span(CLAIM, context=run_context(event.run_id), attributes={
            RUN_ID: event.run_id, TENANT: tenant, SCHEDULE_ID: schedule_id,
            ATTEMPT_NO: event.attempt, FENCE: event.fence, WORKER_ID: event.worker_id,
            COMMAND_ID: command_id})
        span.end()


# ------------------------------------------------------------------ the worker


class AttemptTrace:
    """A worker's attempt span, from the attempt's start to its outcome (``finish``)."""

    __slots__ = ("span",)

    def __init__(self, *, tenant: str, schedule_id: str, run_id: str, attempt: int,
                 fence: int, job_type: str, worker_id: str) -> None:
        self.span: Span | None = _tracer.start_span(
            ATTEMPT, context=run_context(run_id), kind=SpanKind.CONSUMER, attributes={
                RUN_ID: run_id, TENANT: tenant, SCHEDULE_ID: schedule_id, ATTEMPT_NO: attempt,
                FENCE: fence, JOB_TYPE: job_type, WORKER_ID: worker_id})

    def handler(self, job_type: str, start: Callable[[], asyncio.Future[T]]) -> asyncio.Future[T]:
        """Start the handler (``start``: it returns its future) with a handler span, a child
        of the attempt span, as the current context; the span ends with the future."""
        parent = trace.set_span_in_context(self.span) if self.span is not None else None
        span = _tracer.start_span(f"{HANDLER} {job_type}", context=parent,
                                  attributes={JOB_TYPE: job_type})
        with trace.use_span(span, end_on_exit=False):
            fut = start()
        fut.add_done_callback(lambda f: _end_handler(span, f))
        return fut

    def finish(self, outcome: str, error: str | None = None) -> Headers:
        """End the attempt span (once) with its outcome; the record headers that put the
        outcome's command under it."""
        span = self.span
        if span is None:
            return ()
        self.span = None
        span.set_attribute(OUTCOME, outcome)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error[:500]))
        headers = record_headers(trace.set_span_in_context(span))
        span.end()
        return headers


def _end_handler(span: Span, fut: asyncio.Future[Any]) -> None:
    if fut.cancelled():
        span.set_status(Status(StatusCode.ERROR, "cancelled"))
    else:
        error = fut.exception()
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
    span.end()


# ------------------------------------------------------------------ the effect runner


@contextmanager
def effect_span(*, tenant: str, schedule_id: str, run_id: str, effect_id: str, kind: str,
                destination: str, attempt: int) -> Iterator[Span]:
    """The effect runner's span of one effect, current while it is delivered and its
    outcome recorded (a webhook's ``traceparent`` and the outcome command name it)."""
    with _tracer.start_as_current_span(
            f"{EFFECT} {kind}", context=run_context(run_id), kind=SpanKind.CLIENT, attributes={
                RUN_ID: run_id, TENANT: tenant, SCHEDULE_ID: schedule_id, EFFECT_ID: effect_id,
                EFFECT_KIND: kind, EFFECT_DESTINATION: destination,
                EFFECT_ATTEMPT: attempt}) as span:
        yield span


def effect_outcome(span: Span, status: str) -> None:
    """Record an effect's outcome on its span (an error status unless it succeeded)."""
    span.set_attribute(OUTCOME, status)
    if status != "succeeded":
        span.set_status(Status(StatusCode.ERROR, status))


# ------------------------------------------------------------------ the API


class TracingMiddleware:
    """ASGI middleware: a server span per HTTP request, named ``<METHOD> <route>`` once the
    route is known, a child of the request's ``traceparent``; current while the request is
    handled, so the commands it sends carry it."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Awaitable[None]]) -> None:
        if scope["type"] != "http" or not enabled:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or ()
                   if k.lower() in (b"traceparent", b"tracestate")}
        method = str(scope.get("method", "GET"))
        path = str(scope.get("path", ""))
        with _tracer.start_as_current_span(
                method, context=context_of_http(headers), kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "url.path": path}) as span:

            async def sending(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            try:
                await self.app(scope, receive, sending)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.set_attribute("http.route", route)
                span.update_name(f"{method} {route or path}")
