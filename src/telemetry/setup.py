"""The OpenTelemetry SDK, set up from the standard environment (loaded only when tracing is on).

* ``OTEL_TRACES_EXPORTER``: a comma-separated list of ``otlp`` (the default: OTLP over
  HTTP with protobuf, ``opentelemetry-exporter-otlp-proto-http``), ``console`` (spans as
  JSON on stdout) or ``none``;
* ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``..._HEADERS``,
  ``..._TIMEOUT``, ``..._COMPRESSION``, ``..._CERTIFICATE``: read by the exporter itself;
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``..._TRACES_PROTOCOL`` must be ``http/protobuf`` when
  set (no gRPC exporter is installed);
* ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``: the resource (``service.name``
  defaults to the process: ``chronolog-processor``, ``chronolog-worker``, ...);
* ``OTEL_TRACES_SAMPLER`` / ``..._ARG``, ``OTEL_BSP_*`` (the batch processor's delay and
  sizes), ``OTEL_SPAN_*_LIMIT``: read by the SDK.

Spans are exported in batches from a thread; the provider flushes at exit.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from chronolog.telemetry.ids import root_ids

PROTOCOL = "http/protobuf"


class RunIdGenerator(RandomIdGenerator):
    """Random IDs, but a run's root span takes the IDs its run ID names
    (``chronolog.telemetry.ids``), so every process's spans of the run point at it."""

    def generate_trace_id(self) -> int:
        ids = root_ids.get()
        return ids[0] if ids is not None else super().generate_trace_id()

    def generate_span_id(self) -> int:
        ids = root_ids.get()
        return ids[1] if ids is not None else super().generate_span_id()


def exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``)."""
    out: list[SpanExporter] = []
    for name in (env.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp").split(","):
        name = name.strip()
        if name == "otlp":
            protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or PROTOCOL).strip()
            if protocol != PROTOCOL:
                raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL '{protocol}' is not supported: "
                                 f"only {PROTOCOL}")
            out.append(OTLPSpanExporter())
        elif name == "console":
            out.append(ConsoleSpanExporter())
        elif name not in ("", "none"):
            raise ValueError(f"OTEL_TRACES_EXPORTER '{name}' is not supported: otlp, console "
                             "or none")
    return out


def tracer_provider(service_name: str, env: Mapping[str, str]) -> TracerProvider:
    """A tracer provider with the environment's resource, sampler and exporters (each behind
    a batch processor) and the run-aware ID generator."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource, id_generator=RunIdGenerator())
    for exporter in exporters(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
