"""Tracing with OpenTelemetry: one trace per run, W3C trace context across processes.

``ids`` holds the rule that names a run's trace (no dependency: the read side shows it);
``tracing`` the switch, the spans and the propagation helpers every process calls;
``setup`` the SDK's tracer provider and exporters, loaded only when tracing is on
(docs/tracing.md).
"""
