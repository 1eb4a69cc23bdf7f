"""Moving keys to a new routing version: an in-process processor on the first version (2 of
the log's 4 partitions), the ``BeginHandover`` command to version 2, and reading the
answers — shared by the unit tests on the in-memory log and the read-side tests on the real
logs and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import ROUTING_ID, ROUTING_TENANT, partition_key
from chronolog.domain.routing import RoutingTable
from chronolog.log.partitioner import key_hash
from chronolog.log.port import OutRecord
from chronolog.processors.config import ProcessorConfig
from support import processors
from support.polling import wait_until

OLD, NEW = 2, 4
SPEC = {"every": "1h", "job": {"type": "echo"}, "overlap": "allow"}


def config(**kw: Any) -> ProcessorConfig:
    return ProcessorConfig(routing=RoutingTable.initial(OLD), snapshot_interval_s=0.2, **kw)


class Running(processors.Running):
    """An in-process processor (first routing version: 2 partitions) plus a client, and
    where it holds each key."""

    def holders(self, key: str) -> list[int]:
        return sorted(p for p, ps in self.proc.partitions.items() if key in ps.states)

    def states(self) -> dict[str, tuple[int, Any]]:
        """key -> (partition holding it, the state's comparable value)."""
        out: dict[str, tuple[int, Any]] = {}
        for p, ps in self.proc.partitions.items():
            for key, st in ps.states.items():
                assert key not in out, f"{key} held by {out[key][0]} and {p}"
                out[key] = (p, st.snapshot())
        return out

    def views(self) -> dict[int, Any]:
        return {p: ps.routing for p, ps in self.proc.partitions.items()}


def home(key: str, partitions: int) -> int:
    return key_hash(key.encode()) % partitions


async def to_partition(lg: Any, env: m.CommandEnvelope, partition: int) -> None:
    await lg.append([OutRecord(lg.topics.commands,
                               partition_key(env.tenant, env.schedule_id).encode(),
                               codec.encode_command(env), partition)])


async def reply_of(lg: Any, command_id: str) -> m.Reply:
    async def find() -> m.Reply | None:
        for p in range(lg.topics.partitions):
            end = await lg.end_offset(lg.topics.replies, p)
            for rec in await lg.read(lg.topics.replies, p, 0, max(1, end)):
                if rec.key == command_id.encode():
                    return codec.decode_reply(rec.value)
        return None
    reply: m.Reply = await wait_until(find, 30, what=f"the reply to {command_id}")
    return reply


def begin(client: Client, partition: int) -> m.CommandEnvelope:
    return m.CommandEnvelope(
        command_id=f"begin-{uuid.uuid4().hex[:8]}-{partition}", type="BeginHandover",
        tenant=ROUTING_TENANT, principal="processor", schedule_id=ROUTING_ID,
        issued_at=client.envelope("t", "x", m.Tick()).issued_at, reply_to=client.client_id,
        payload=m.BeginHandover(partitions=(OLD, NEW), to_version=2))
