"""Whether a long-running process is ready to do its work, for a supervisor to read.

``Readiness(process, path)`` holds one process's readiness: ``ready`` (bool), ``reason``
(one line: what it serves, or what it waits for) and ``since`` (when ``ready`` last changed).
With a path (``--ready-file PATH`` or ``CHRONOLOG_READY_FILE``) every change is written to
that file as ``{"ready": bool, "reason": str, "since": iso, "process": str, "pid": int}``,
atomically (a temporary file in the same directory, then ``os.replace``): a reader — a
Kubernetes exec probe, a supervisor, ``scripts/chaos.py`` — sees the old or the new
document, never half of one. A flip of ``ready`` is logged (``process_ready`` /
``process_not_ready`` with the reason), so an outage costs two log lines here, not one per
probe.

``watch(readiness, probe, interval)`` evaluates ``probe()`` (a coroutine returning
``(ready, reason)``) every ``interval`` seconds until cancelled; a probe that raises or does
not answer within ``interval * 3`` counts as not ready with that reason. The process says
what ready means (``chronolog.processors``, ``projections``, ``workers``, ``effects``
and the API each define it; docs/deployment.md, "Readiness"); the probes of the services
they share are here: ``log_reachable`` and ``database_reachable`` (a bounded request each,
``None`` when it answered, else the reason).

On exit (``probing`` leaves) the file says ``{"ready": false, "reason": "stopped"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from chronolog.wakeup import wait_within

__all__ = ["READY_FILE_ENV", "Readiness", "database_reachable", "log_reachable", "probing",
           "ready_file", "watch"]

READY_FILE_ENV = "CHRONOLOG_READY_FILE"
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 3.0  # a service request of a probe that takes longer: the service is away

Probe = Callable[[], Awaitable[tuple[bool, str]]]

log = structlog.get_logger("chronolog.readiness")


def ready_file(value: str | None = None) -> str | None:
    """The readiness file: the flag's value, else ``CHRONOLOG_READY_FILE``, else none."""
    return value or os.environ.get(READY_FILE_ENV) or None


class Readiness:
    """One process's readiness, written to ``path`` (if any) whenever it changes."""

    def __init__(self, process: str, path: str | os.PathLike[str] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.process = process
        self.path = Path(path) if path else None
        self._clock = clock
        self.ready = False
        self.reason = "starting"
        self.since = clock()
        self._write()

    def document(self) -> dict[str, Any]:
        return {"ready": self.ready, "reason": self.reason,
                "since": self.since.isoformat().replace("+00:00", "Z"),
                "process": self.process, "pid": os.getpid()}

    def set(self, ready: bool, reason: str) -> bool:
        """Record the readiness; True when it changed (and the file was written)."""
        reason = " ".join(reason.split())[:500]
        if ready == self.ready and reason == self.reason:
            return False
        if ready != self.ready:
            self.since = self._clock()
            if ready:
                log.info("process_ready", process=self.process, reason=reason)
            else:
                log.warning("process_not_ready", process=self.process, reason=reason)
        self.ready, self.reason = ready, reason
        self._write()
        return True

    def _write(self) -> None:
        if self.path is None:
            return
        data = json.dumps(self.document()).encode() + b"\n"
        tmp: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except OSError as exc:  # a full or read-only disk must not stop the process
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            log.warning("ready_file_not_written", path=str(self.path), error=str(exc))


async def watch(readiness: Readiness, probe: Probe, interval: float = PROBE_INTERVAL_S) -> None:
    """Evaluate ``probe`` every ``interval`` seconds until cancelled (module docstring)."""
    while True:
        try:
            ready, reason = await wait_within(probe(), interval * 3 + PROBE_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing probe means not ready
            ready, reason = False, f"probe failed: {type(exc).__name__}: {exc}"
        readiness.set(ready, reason)
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def probing(readiness: Readiness, probe: Probe,
                  interval: float = PROBE_INTERVAL_S) -> AsyncIterator[Readiness]:
    """``watch`` in a task while the block runs; then the readiness says ``stopped``."""
    task = asyncio.create_task(watch(readiness, probe, interval), name="readiness")
    try:
        yield readiness
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        readiness.set(False, "stopped")


def _error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


async def log_reachable(log_: Any, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """``None`` when the log answers a bounded request (the end offset of ``commands``
    partition 0) and has the replicas a write needs (``EventLog.write_quorum``), else why
    not, starting ``log unreachable``."""
    try:
        quorum = await wait_within(log_.write_quorum(), timeout)
        if quorum is not None:
            return f"log unreachable: {quorum}"
        await wait_within(log_.end_offset(log_.topics.commands, 0), timeout)
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        return f"log unreachable: no answer within {timeout:g}s"
    except Exception as exc:  # noqa: BLE001 - any failure: the log is not usable now
        return f"log unreachable: {_error(exc)}"
    return None


async def database_reachable(pool: Any, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """``None`` when PostgreSQL answers ``SELECT 1`` through ``pool`` within ``timeout``,
    else why not, starting ``read model unreachable``."""
    try:
        await wait_within(pool.fetchval("SELECT 1"), timeout)
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        return f"read model unreachable: no answer within {timeout:g}s"
    except Exception as exc:  # noqa: BLE001 - any failure: the database is not usable now
        return f"read model unreachable: {_error(exc)}"
    return None
