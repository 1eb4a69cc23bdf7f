"""chronolog.telemetry: the trace-ID rule, the switch, the W3C propagation helpers, and the
spans made through the SDK's in-memory exporter (real SDK, real asyncio handler)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chronolog.domain import messages as m
from chronolog.telemetry import tracing
from chronolog.telemetry.ids import run_trace_id, run_trace_ids
from chronolog.telemetry.setup import RunIdGenerator, exporters

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Traced(InMemorySpanExporter):
    """The spans of a provider of its own (the run-aware IDs), kept in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.provider = TracerProvider(id_generator=RunIdGenerator())
        self.provider.add_span_processor(SimpleSpanProcessor(self))


@pytest.fixture
def spans() -> Iterator[Traced]:
    """Tracing on, through ``Traced``'s provider."""
    traced = Traced()
    tracing.enable(traced.provider)
    try:
        yield traced
    finally:
        tracing.disable()
        traced.provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


# ---------------------------------------------------------------------- the trace-ID rule


def test_a_runs_trace_and_root_span_ids_are_the_documented_hash_of_its_run_id() -> None:
    d = hashlib.sha256(b"chronolog.run\0r_0123456789abcdef0123").digest()
    assert run_trace_ids("r_0123456789abcdef0123") == (int.from_bytes(d[:16], "big"),
                                                        int.from_bytes(d[16:24], "big"))
    assert run_trace_id("r_0123456789abcdef0123") == d[:16].hex()
    ids = {run_trace_id(f"m_{i}") for i in range(1000)}
    assert len(ids) == 1000 and all(len(t) == 32 and int(t, 16) for t in ids)


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
])
def test_tracing_is_on_only_when_the_environment_names_an_exporter_or_endpoint(
        env: dict[str, str], on: bool) -> None:
    assert tracing.requested(env) is on


def test_without_otel_variables_configure_turns_nothing_on() -> None:
    assert tracing.configure_tracing("chronolog-test", {}) is False
    assert tracing.enabled is False


def test_an_exporter_or_protocol_not_installed_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER 'zipkin'"):
        exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="'grpc' is not supported"):
        exporters({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert [type(e).__name__ for e in exporters({"OTEL_TRACES_EXPORTER": "otlp,console"})] \
        == ["OTLPSpanExporter", "ConsoleSpanExporter"]


# ---------------------------------------------------------------------- propagation


def test_record_headers_round_trip_a_span_context() -> None:
    caller = tracing.context_of([("traceparent", CALLER.encode()),
                                 ("tracestate", b"vendor=1")])
    assert caller is not None
    sc = trace.get_current_span(caller).get_span_context()
    assert (f"{sc.trace_id:032x}", f"{sc.span_id:016x}") == (
        "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    assert dict(tracing.record_headers(caller)) == {"traceparent": CALLER.encode(),
                                                    "tracestate": b"vendor=1"}
    assert tracing.http_headers(caller)["traceparent"] == CALLER


def test_a_runs_headers_name_its_root_span_and_nothing_else_makes_headers() -> None:
    t, s = run_trace_ids("r_1")
    assert tracing.run_headers("r_1") == (("traceparent", f"00-{t:032x}-{s:016x}-01".encode()),)
    assert tracing.record_headers() == ()  # no current span: no header
    assert tracing.http_headers() == {}


@pytest.mark.parametrize("headers", [
    [], [("tracestate", b"a=1")], [("traceparent", b"garbage")],
    [("traceparent", b"00-00000000000000000000000000000000-b7ad6b7169203331-01")],
    [("traceparent", b"\xff\xfe")], [("other", CALLER.encode())],
])
def test_a_missing_or_invalid_traceparent_gives_no_context(
        headers: list[tuple[str, bytes]]) -> None:
    assert tracing.context_of(headers) is None


# ---------------------------------------------------------------------- the spans


def materialized(run_id: str) -> m.OccurrenceMaterialized:
    return m.OccurrenceMaterialized(run_id=run_id, scheduled_at=NOW, due_at=NOW, revision=1,
                                    job=m.JobSpec(type="invoice"), trigger="manual",
                                    state="READY", sequence=1)


def test_a_traced_command_s_decision_is_the_callers_child_linked_to_the_run_it_made(
        spans: Traced) -> None:
    made = materialized("m_1")
    cause = tracing.decided("TriggerRun", "c1", "acme", "s1", "ok", [made],
                            [("traceparent", CALLER.encode())], appended_ms=1_700_000_000_000)
    tracing.run_event("acme", "s1", "c1", made, cause)
    tracing.run_event("acme", "s1", "tick:0:1:acme/s1", materialized("r_9"), cause)
    decision = named(spans, "chronolog.decide TriggerRun")
    occurrence, other = sorted((s for s in spans.get_finished_spans()
                                if s.name == "chronolog.occurrence"),
                               key=lambda s: s.context.trace_id != run_trace_ids("m_1")[0])
    trace_id, root = run_trace_ids("m_1")
    assert decision.parent is not None and decision.parent.span_id == 0xb7ad6b7169203331
    assert decision.context.trace_id == 0x0af7651916cd43dd8448eb211c80319c
    assert decision.start_time == 1_700_000_000_000 * 1_000_000  # when it was appended
    assert decision.attributes is not None and decision.attributes["chronolog.tenant"] == "acme"
    assert [(ln.context.trace_id, ln.context.span_id) for ln in decision.links] == [
        (trace_id, root)]
    # the run's root: the IDs its run ID names, no parent, linked back to its cause
    assert (occurrence.context.trace_id, occurrence.context.span_id) == (trace_id, root)
    assert occurrence.parent is None
    assert [ln.context.span_id for ln in occurrence.links] == [decision.context.span_id]
    # a run another command made (a Tick of the same batch) is not linked to this cause
    assert other.context.trace_id == run_trace_ids("r_9")[0] and other.links == ()


def test_an_untraced_command_makes_no_decision_span_and_a_claim_is_under_the_root(
        spans: Traced) -> None:
    assert tracing.decided("Heartbeat", "c2", "acme", "s1", "ok", [], []) is None
    assert spans.get_finished_spans() == ()
    claimed = m.AttemptClaimed(run_id="r_2", attempt=1, fence=3, worker_id="w1",
                               claimed_at=NOW, lease_until=NOW)
    tracing.run_event("acme", "s1", "assign:0:r_2:1", claimed, None)
    claim = named(spans, "chronolog.claim")
    assert claim.context.trace_id == run_trace_ids("r_2")[0]
    assert claim.parent is not None and claim.parent.span_id == run_trace_ids("r_2")[1]
    assert claim.attributes is not None and claim.attributes["chronolog.fence"] == 3


async def test_a_handler_runs_in_its_span_under_the_attempt_and_its_own_spans_are_children(
        spans: Traced) -> None:
    user = trace.get_tracer("billing", tracer_provider=spans.provider)

    async def handler() -> int:
        with user.start_as_current_span("render-invoice"):  # as docs/tracing.md shows
            inner = trace.get_current_span().get_span_context()
        return inner.trace_id

    att = tracing.AttemptTrace(tenant="acme", schedule_id="s1", run_id="r_3", attempt=1,
                               fence=2, job_type="invoice", worker_id="w1")
    fut = att.handler("invoice", lambda: asyncio.ensure_future(handler()))
    assert await fut == run_trace_ids("r_3")[0]
    headers = att.finish("CompleteRun")
    assert att.finish("discarded") == ()  # ended once
    attempt = named(spans, "chronolog.attempt")
    handler_span = named(spans, "chronolog.handler invoice")
    own = named(spans, "render-invoice")
    assert attempt.parent is not None and attempt.parent.span_id == run_trace_ids("r_3")[1]
    assert handler_span.parent is not None
    assert handler_span.parent.span_id == attempt.context.span_id
    assert own.parent is not None and own.parent.span_id == handler_span.context.span_id
    assert attempt.attributes is not None
    assert attempt.attributes["chronolog.outcome"] == "CompleteRun"
    # the outcome command's record names the attempt span
    assert dict(headers)["traceparent"].decode().split("-")[2] == \
        f"{attempt.context.span_id:016x}"


async def test_a_failing_handler_ends_its_span_with_an_error(
        spans: Traced) -> None:
    async def handler() -> None:
        raise RuntimeError("boom")

    att = tracing.AttemptTrace(tenant="acme", schedule_id="s1", run_id="r_4", attempt=1,
                               fence=2, job_type="fail", worker_id="w1")
    fut = att.handler("fail", lambda: asyncio.ensure_future(handler()))
    with pytest.raises(RuntimeError):
        await fut
    att.finish("FailRun", "RuntimeError: boom")
    assert not named(spans, "chronolog.handler fail").status.is_ok
    assert named(spans, "chronolog.attempt").status.description == "RuntimeError: boom"


def test_an_effect_span_is_current_under_the_root_and_names_the_webhooks_traceparent(
        spans: Traced) -> None:
    with tracing.effect_span(tenant="acme", schedule_id="s1", run_id="r_5",
                             effect_id="webhook-r_5", kind="webhook", destination="billing",
                             attempt=1) as span:
        sent = tracing.http_headers()
        tracing.effect_outcome(span, "succeeded")
    effect = named(spans, "chronolog.effect webhook")
    assert sent["traceparent"] == (f"00-{effect.context.trace_id:032x}-"
                                   f"{effect.context.span_id:016x}-01")
    assert effect.context.trace_id == run_trace_ids("r_5")[0]
    assert effect.status.is_ok
