"""A whole chronolog behind the HTTP API, in one process, for the API tests.

``ApiStack`` starts, on a real log (SQLite or Kafka): a processor (with the test tenants), a
command client, a PostgreSQL store in a fresh schema, a projector task, and the FastAPI app
served through ``httpx.AsyncClient(ASGITransport)``. ``pause_projector`` / ``resume_projector``
stop and restart the projector task (read-your-writes tests).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from chronolog.api.app import create_app
from chronolog.client import Client
from chronolog.destinations import WebhookDestination
from chronolog.log.port import EventLog
from chronolog.processors.runtime import Processor
from chronolog.projections.projector import Projector
from chronolog.projections.store import PostgresProjectionStore
from chronolog.tenants import Tenant, Tenants
from support.polling import finish_each, wait_until

from .pgdb import schema_store

TENANTS = Tenants({
    "acme": Tenant("acme", ("acme-token",), None, 1000, {"hook": WebhookDestination(
        kind="webhook", url="https://hooks.example/chronolog")}),
    "globex": Tenant("globex", ("globex-token",), frozenset({"report"}), 1000),
    "initech": Tenant("initech", ("initech-token",), None, 2),
    "hooli": Tenant("hooli", ("hooli-token",), None, 1),
})

ACME = {"Authorization": "Bearer acme-token"}
GLOBEX = {"Authorization": "Bearer globex-token"}
INITECH = {"Authorization": "Bearer initech-token"}
HOOLI = {"Authorization": "Bearer hooli-token"}


class ApiStack:
    """Processor + client + projector + app on one log and one PostgreSQL schema."""

    def __init__(self, lg: EventLog, dsn: str, tenants: Tenants = TENANTS,
                 **app_options: Any) -> None:
        self.lg = lg
        self.dsn = dsn
        self.tenants = tenants
        self.app_options = app_options
        self.proc = Processor(lg, f"p-{uuid.uuid4().hex[:6]}", tenants=tenants)
        self.client = Client(lg, reply_timeout=30)
        self.store: PostgresProjectionStore | None = None
        self.projector: Projector | None = None
        self._proc_task: asyncio.Task[None] | None = None
        self._proj_task: asyncio.Task[None] | None = None
        self.http: httpx.AsyncClient | None = None
        self.app: Any = None

    async def __aenter__(self) -> ApiStack:
        self.store = await schema_store(self.dsn, max_size=8)
        self._proc_task = asyncio.create_task(self.proc.run())
        await self.client.start()
        await wait_until(lambda: len(self.proc.partitions) == self.lg.topics.partitions,
                         60, what="partitions assigned")
        self.resume_projector()
        app = self.app = create_app(self.client, self.store, self.tenants, **self.app_options)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                      base_url="http://chronolog.test")
        return self

    def resume_projector(self) -> None:
        assert self.store is not None and self._proj_task is None
        self.projector = Projector(self.lg, self.store, batch_max=2000, idle_ms=20)
        self._proj_task = asyncio.create_task(self.projector.run())

    async def pause_projector(self) -> None:
        assert self.projector is not None and self._proj_task is not None
        self.projector.stop()
        await asyncio.wait_for(self._proj_task, 30)
        self._proj_task = None

    async def _stop_processor(self) -> None:
        assert self._proc_task is not None
        self.proc.stop()
        await self._proc_task

    async def __aexit__(self, *exc: object) -> None:
        steps: list[tuple[str, Any]] = []
        if self.http is not None:
            steps.append(("closing the HTTP client", self.http.aclose))
        if self._proj_task is not None:
            steps.append(("stopping the projector", self.pause_projector))
        steps.append(("closing the command client", self.client.close))
        if self._proc_task is not None:
            steps.append(("stopping the processor", self._stop_processor))
        if self.store is not None:
            steps.append(("closing the read model's pool", self.store.close))
        await finish_each(steps, 60)
