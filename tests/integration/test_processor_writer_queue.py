"""The writer loop of a processor on a log with ``commit_many`` (the embedded SQLite log).

Work decided while a commit is in flight is queued and committed right after it, all in one
``commit_many``; a partition whose commit failed has its queued work discarded and is taken
over again from the log, so each command is still decided exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from chronolog.client import Client
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.log.partitioner import partition_for
from chronolog.log.port import LogError, Topics
from chronolog.log.sqlite import SqliteEventLog
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.runtime import Processor
from support.polling import wait_until
from support.processors import SPEC, events

from .conftest import started

SPEC_ONCE = {**SPEC, "every": "1h"}  # no timers firing during the test


@pytest.fixture
async def sqlite_log(tmp_path: Path, topic_prefix: str) -> AsyncIterator[SqliteEventLog]:
    async with started(SqliteEventLog(tmp_path / "log.db",
                                      Topics(prefix=topic_prefix, partitions=6))) as lg:
        yield lg


def ids_on_distinct_partitions(n: int, count: int) -> list[str]:
    """``count`` schedule ids of tenant acme, each on its own partition."""
    out: dict[int, str] = {}
    for i in range(1000):
        p = partition_for(partition_key("acme", f"s{i}").encode(), n)
        out.setdefault(p, f"s{i}")
        if len(out) == count:
            return list(out.values())
    raise AssertionError("not enough partitions")


class Gate:
    """Holds the log's first commit (``owner.commit`` or ``commit_many``) until opened;
    records the partitions of every commit; ``fail`` makes the held commit raise instead."""

    def __init__(self, lg: SqliteEventLog, fail: bool = False) -> None:
        self.opened = asyncio.Event()
        self.calls: list[list[int]] = []  # the partitions of each commit, in order
        self.fail = fail
        many, acquire = lg.commit_many, lg.acquire

        async def gated(partitions: list[int], commit: Any) -> Any:
            self.calls.append(partitions)
            if len(self.calls) == 1:
                await self.opened.wait()
                if self.fail:
                    raise LogError("injected: the first commit's outcome is unknown")
            return await commit()

        async def commit_many(batches: Any) -> Any:
            return await gated([b[0].partition for b in batches], lambda: many(batches))

        async def gated_acquire(p: int, member: str) -> Any:
            owner = await acquire(p, member)
            commit = owner.commit

            async def one(*args: Any, **kwargs: Any) -> Any:
                return await gated([p], lambda: commit(*args, **kwargs))

            owner.commit = one  # type: ignore[method-assign]
            return owner

        lg.commit_many = commit_many  # type: ignore[method-assign]
        lg.acquire = gated_acquire  # type: ignore[method-assign]


async def run(lg: SqliteEventLog) -> tuple[Processor, Client, asyncio.Task[None]]:
    # snapshots off: their chunks, written while the processor is idle, would join the
    # queue as batches of their own (tests/integration/test_snapshots.py covers them)
    proc = Processor(lg, "p1", config=ProcessorConfig(snapshots=False))
    client = Client(lg, reply_timeout=30)
    task = asyncio.create_task(proc.run())
    await client.start()
    await wait_until(lambda: len(proc.partitions) == lg.topics.partitions, 30,
                     what="partitions assigned")
    return proc, client, task


def queued_commands(proc: Processor) -> int:
    return sum(len(w.batch) for w in proc._queued)


async def test_work_decided_during_a_commit_is_committed_together_right_after_it(
    sqlite_log: SqliteEventLog,
) -> None:
    gate = Gate(sqlite_log)
    proc, client, task = await run(sqlite_log)
    spec = m.ScheduleSpec.model_validate(SPEC_ONCE)
    first_id, b_id, c_id = ids_on_distinct_partitions(sqlite_log.topics.partitions, 3)
    try:
        first = asyncio.create_task(client.send(client.envelope("acme", first_id,
                                                                m.CreateSchedule(spec=spec))))
        await wait_until(lambda: gate.calls, 10, what="the first commit to start")
        later = []
        for i, (sid, payload) in enumerate(((b_id, m.CreateSchedule(spec=spec)),
                                            (c_id, m.CreateSchedule(spec=spec)),
                                            (first_id, m.PauseSchedule()))):
            # one at a time: each is polled and decided while the first commit is held
            later.append(asyncio.create_task(client.send(client.envelope("acme", sid, payload))))
            await wait_until(lambda i=i: queued_commands(proc) == i + 1, 10,
                             what=f"command {i + 1} decided and queued behind the held commit")
        assert not first.done() and not any(t.done() for t in later)
        gate.opened.set()
        replies = await asyncio.wait_for(asyncio.gather(first, *later), 20)
        assert [r.status for r in replies] == ["ok"] * 4
        # all three queued batches went to the log in ONE commit, right after the held one
        assert len(gate.calls) == 2, gate.calls
        assert sorted(gate.calls[1]) == sorted({partition_for(partition_key("acme", s).encode(),
                                                              sqlite_log.topics.partitions)
                                                for s in (b_id, c_id, first_id)})
        assert replies[0].positions[-1].offset < replies[3].positions[0].offset  # order kept
    finally:
        gate.opened.set()
        await client.close()
        proc.stop()
        await asyncio.wait_for(task, 30)


async def test_a_failed_commit_discards_its_partitions_queued_work_and_decides_it_again(
    sqlite_log: SqliteEventLog,
) -> None:
    gate = Gate(sqlite_log, fail=True)
    proc, client, task = await run(sqlite_log)
    spec = m.ScheduleSpec.model_validate(SPEC_ONCE)
    first_id, other_id = ids_on_distinct_partitions(sqlite_log.topics.partitions, 2)
    try:
        create = client.envelope("acme", first_id, m.CreateSchedule(spec=spec))
        first = asyncio.create_task(client.send(create))
        await wait_until(lambda: gate.calls, 10, what="the first commit to start")
        pause = client.envelope("acme", first_id, m.PauseSchedule())
        other = client.envelope("acme", other_id, m.CreateSchedule(spec=spec))
        later = [asyncio.create_task(client.send(env)) for env in (pause, other)]
        await wait_until(lambda: queued_commands(proc) == 2, 10, what="the later commands queued")
        gate.opened.set()  # the held commit fails: its partition is dropped and taken over
        replies = await asyncio.wait_for(asyncio.gather(first, *later), 30)
        assert [r.status for r in replies] == ["ok"] * 3
        causes = Counter(e.causation_id for e in await events(sqlite_log))
        # each command decided into the log exactly once (the failed commit wrote nothing):
        # its events are exactly those its reply points at
        for env, reply in zip((create, pause, other), replies, strict=True):
            caused = [p for p in reply.positions if p.topic == sqlite_log.topics.events]
            assert caused and causes[env.command_id] == len(caused), env.payload.type
    finally:
        gate.opened.set()
        await client.close()
        proc.stop()
        await asyncio.wait_for(task, 30)
