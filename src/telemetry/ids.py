"""A run's trace, named by its run ID alone.

Every process that touches a run — the processor that materializes and assigns it, the
worker that runs its handler, the effect runner that delivers its effects — starts its spans
in the same trace without being told which: the trace ID is derived from the run ID, and so
is the span ID of the run's root span (the occurrence span the processor writes when it
materializes the run). Nothing is stored: the API, the CLI and the dashboard derive the same
ID from the run ID they show, and a replay of the log derives nothing new.

The rule: ``d = SHA-256("chronolog.run\\0" + run_id)``; the trace ID is the first 16 bytes of
``d`` (32 lower-case hex digits in W3C ``traceparent`` form), the root span ID the next 8; an
all-zero value (invalid in W3C trace context) is replaced by 1.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

_DOMAIN = b"chronolog.run\0"


def run_trace_ids(run_id: str) -> tuple[int, int]:
    """(trace ID, root span ID) of a run's trace, as the integers OpenTelemetry uses."""
    d = hashlib.sha256(_DOMAIN + run_id.encode()).digest()
    return int.from_bytes(d[:16], "big") or 1, int.from_bytes(d[16:24], "big") or 1


def run_trace_id(run_id: str) -> str:
    """A run's trace ID as 32 lower-case hex digits (the form tracing back ends search)."""
    return f"{run_trace_ids(run_id)[0]:032x}"


#: (trace ID, span ID) the next span made in this context takes instead of fresh random
#: ones: set only around the making of a run's root span (``RunIdGenerator`` reads it)
root_ids: ContextVar[tuple[int, int] | None] = ContextVar("chronolog_root_ids", default=None)
