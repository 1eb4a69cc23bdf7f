"""An in-process processor and client on one log, and reading what they wrote: shared by
the processor's unit tests (on the in-memory log) and the integration tests (on SQLite and
Kafka)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.environment import utc_now
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.runtime import Processor
from support.polling import wait_until

SPEC = {"every": "1s", "job": {"type": "echo", "params": {"x": 1}}, "overlap": "allow"}


async def read_all(lg: Any, topic: str) -> list[Any]:
    out = []
    for p in range(lg.topics.partitions):
        end = await lg.end_offset(topic, p)
        offset = 0
        while offset < end:
            recs = await lg.read(topic, p, offset, 1000)
            if not recs:
                break
            out.extend(recs)
            offset = recs[-1].offset + 1
    return out


async def events(lg: Any) -> list[m.EventEnvelope]:
    return [codec.decode_event(r.value) for r in await read_all(lg, lg.topics.events)]


class Running:
    """An in-process processor plus a client, on one log."""

    def __init__(self, lg: Any, member: str = "p1", config: ProcessorConfig | None = None,
                 tenants: Any = None, clock: Callable[[], datetime] = utc_now) -> None:
        self.lg = lg
        self.proc = Processor(lg, member, tenants=tenants, config=config, clock=clock)
        self.client = Client(lg, reply_timeout=30)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.proc.run())
        await self.client.start()
        await wait_until(lambda: len(self.proc.partitions) == self.lg.topics.partitions,
                         30, what="partitions assigned")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        self.proc.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)
