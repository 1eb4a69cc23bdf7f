"""``chronolog repartition --to P`` on a running deployment, on both logs.

The whole change under a steady load: a deployment of 12 partitions with two ``chronolog
processor`` processes and a ``chronolog worker`` runs schedules firing every second (misfire
``all``: every instant is due exactly once), and ``chronolog repartition --to 24`` runs as an
operator would run it. One processor is killed (SIGKILL) during the change — on Kafka frozen
(SIGSTOP) as it begins and killed once the other's first partition has handed over; on the
embedded log, where a frozen process may hold the database's write lock, killed as the
topics grow — and a third is started: the killed one's partitions hand over only after their
takeover, and the change completes. Then:

* every schedule that moved is held by exactly one partition at any moment (nothing of it
  on its old home after its ``KeyMovedOut``, its ``KeyMovedIn`` on its new home);
* every instant of every schedule is materialized exactly once, with no gap;
* each schedule's fences strictly increase across the move;
* a manual trigger repeated after the move with the request key used before it answers the
  run of before;
* ``chronolog audit`` of the log is clean;
* the routing history says version 2 (24 partitions) is complete.

A change the processors cannot finish (none running) exits 1 after ``--timeout``, and the
same command run again once a processor runs goes on and completes (resume); bad input exits
2 naming it, and writes nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.domain.routing import RoutingVersion
from chronolog.log.partitioner import partition_for
from chronolog.log.port import Topics
from chronolog.log.routing_history import read_history, read_routing
from chronolog.settings import LogConfig, open_log
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT, ProcessorProcess, log_url, started

OLD, NEW = 12, 24
EVERY = {"every": "1s", "job": {"type": "noop"}, "overlap": "allow",
         "misfire": {"policy": "all", "grace": "5m"}}
MANUAL = {"every": "1h", "job": {"type": "noop"}, "overlap": "allow"}


@pytest.fixture
def cfg(log_config: LogConfig) -> LogConfig:
    """The test's log with 12 partitions."""
    return LogConfig(log_config.kind, log_config.target,
                     Topics(prefix=log_config.topics.prefix, partitions=OLD))


def cli_env(cfg: LogConfig) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return {**env, "CHRONOLOG_TOPIC_PREFIX": cfg.topics.prefix}


def repartition(cfg: LogConfig, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([CHRONOLOG, "repartition", "--log", log_url(cfg), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(cfg), cwd=ROOT)


def lines(proc: subprocess.Popen[str]) -> Iterator[str]:
    assert proc.stdout is not None
    yield from iter(proc.stdout.readline, "")


def moving_ids(n: int, moving: bool, prefix: str = "s") -> list[str]:
    """``n`` schedule IDs whose home changes from 12 to 24 partitions (or does not)."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        sid = f"{prefix}{i}"
        key = partition_key("acme", sid).encode()
        if (partition_for(key, OLD) != partition_for(key, NEW)) == moving:
            out.append(sid)
        i += 1
    return out


class Worker:
    def __init__(self, cfg: LogConfig, log_path: Path) -> None:
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [CHRONOLOG, "worker", "--log", log_url(cfg), "--topic-prefix", cfg.topics.prefix,
             "--partitions", str(OLD), "--builtin-jobs", "--results",
             str(log_path.parent / "results")],
            stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"), env=os.environ, cwd=ROOT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def all_events(lg: Any) -> list[tuple[int, int, m.EventEnvelope]]:
    """(partition, offset, event) of every event, partition by partition."""
    out: list[tuple[int, int, m.EventEnvelope]] = []
    n = (await lg.prefixed_topics())[lg.topics.events]
    for p in range(n):
        end = await lg.end_offset(lg.topics.events, p)
        offset = 0
        while offset < end:
            recs = await lg.read(lg.topics.events, p, offset, 2000)
            if not recs:
                break
            out.extend((p, r.offset, codec.decode_event(r.value)) for r in recs)
            offset = recs[-1].offset + 1
    return out


def in_order(events: list[tuple[int, int, m.EventEnvelope]], key: str
             ) -> list[tuple[int, m.EventEnvelope]]:
    """A key's events in the order they happened: its old home's up to its move, then its
    new home's from its adoption (the test checks there are no others)."""
    mine = [(p, o, e) for p, o, e in events if e.key == key]
    out = out_old = [(p, e) for p, _, e in mine if p == partition_for(key.encode(), OLD)]
    new = partition_for(key.encode(), NEW)
    if new != partition_for(key.encode(), OLD):
        out = out_old + [(p, e) for p, _, e in mine if p == new]
    return out


@pytest.mark.long(25)
async def test_a_change_to_24_partitions_under_load_survives_a_kill_9_and_loses_nothing(
    cfg: LogConfig, tmp_path: Path,
) -> None:
    ticking = moving_ids(6, True) + moving_ids(3, False)
    manual = moving_ids(4, True, "m")
    async with started(open_log(cfg)) as lg:
        a = ProcessorProcess(cfg, "proc-a", tmp_path)
        b = ProcessorProcess(cfg, "proc-b", tmp_path)
        worker = Worker(cfg, tmp_path / "worker.log")
        c: ProcessorProcess | None = None
        try:
            async with Client(lg, reply_timeout=60) as client:
                runs: dict[str, str] = {}
                for sid in manual:
                    await client.create_schedule("acme", sid, MANUAL)
                    runs[sid] = (await client.trigger("acme", sid, f"rk-{sid}"))["run_id"]
                for sid in ticking:
                    await client.create_schedule("acme", sid, EVERY)

                async def results() -> int:
                    return sum(1 for _, _, e in await all_events(lg)
                               if e.type == "ResultPublished")

                await wait_until(lambda: _at_least(results(), 3 * len(ticking)), 90,
                                 what="the load running (results published)")
                # On Kafka A freezes (its partitions cannot hand over) and is killed once
                # B's first partition has: the change is surely half done when its owner
                # dies. On the embedded log a frozen process may hold the database's write
                # lock, which every writer then waits for: A is killed as the change begins.
                frozen = cfg.kind == "kafka"
                if frozen:
                    a.signal(signal.SIGSTOP)
                change = repartition(cfg, "--to", str(NEW), "--timeout", "240")
                said = await asyncio.to_thread(
                    _until, change, "handed over to version 2" if frozen else "topics grown")
                a.signal(signal.SIGKILL)
                assert sum("handed over to version 2" in x for x in said) < OLD
                c = ProcessorProcess(cfg, "proc-c", tmp_path)
                said += await asyncio.to_thread(lambda: [x.rstrip("\n") for x in lines(change)])
                assert await asyncio.to_thread(change.wait, 300) == 0, (
                    said, change.stderr.read() if change.stderr else "")
                assert said[0] == f"version 2 begun: {OLD} -> {NEW} partitions"
                assert any(x.startswith(f"topics grown to {NEW} partitions: ") for x in said)
                assert sum("handed over to version 2" in x for x in said) == OLD, said
                assert said[-1] == f"version 2 complete: clients route by {NEW} partitions"

                # the load goes on on the new homes
                base = await results()
                await wait_until(lambda: _at_least(results(), base + 3 * len(ticking)), 90,
                                 what="results after the change")
                # a request key used before the move still names its run
                for sid in manual:
                    again = await client.trigger("acme", sid, f"rk-{sid}")
                    assert again["run_id"] == runs[sid], sid
        finally:
            worker.stop()
            for proc in (a, b, c):
                if proc is not None:
                    proc.stop()
        assert a.proc.returncode == -signal.SIGKILL

        table = await read_routing(lg)
        assert table.current == RoutingVersion(2, NEW) and table.migrating is None
        assert [(ch.version, ch.partitions, ch.done) for ch in await read_history(lg)] == [
            (1, OLD, True), (2, NEW, False), (2, NEW, True)]
        events = await all_events(lg)

    for sid in ticking + manual:
        key = partition_key("acme", sid)
        old, new = partition_for(key.encode(), OLD), partition_for(key.encode(), NEW)
        holders = {p for p, _, e in events if e.key == key}
        if old == new:
            assert holders == {old}, sid
            continue
        assert holders == {old, new}, sid
        on_old = [e.type for p, _, e in events if e.key == key and p == old]
        on_new = [e.type for p, _, e in events if e.key == key and p == new]
        assert on_old[-1] == "KeyMovedOut" and on_old.count("KeyMovedOut") == 1, (sid, on_old)
        assert on_new[0] == "KeyMovedIn" and on_new.count("KeyMovedIn") == 1, (sid, on_new)
    moved_ticking = [s for s in ticking if s in moving_ids(6, True)]
    for sid in ticking:
        history = [e for _, e in in_order(events, partition_key("acme", sid))]
        instants = [e.payload.scheduled_at for e in history
                    if e.type == "OccurrenceMaterialized"]
        assert len(instants) == len(set(instants)), f"{sid}: an instant twice"
        gaps = [y - x for x, y in pairwise(sorted(instants)) if y - x != timedelta(seconds=1)]
        assert gaps == [], f"{sid}: instants missed {gaps}"
        fences = [e.payload.fence for e in history if e.type == "FenceAdvanced"]
        assert fences == sorted(set(fences)), f"{sid}: fences {fences}"
        if sid in moved_ticking:  # the load ran on both sides of the move
            moved_at = next(i for i, e in enumerate(history) if e.type == "KeyMovedOut")
            assert any(e.type == "FenceAdvanced" for e in history[:moved_at]), sid
            assert any(e.type == "FenceAdvanced" for e in history[moved_at:]), sid

    audit = subprocess.run([CHRONOLOG, "audit", "--log", log_url(cfg)], capture_output=True,
                           text=True, env=cli_env(cfg), timeout=300)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert audit.stdout.splitlines()[-1].startswith("audit ok: ")


def _until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    """The change's lines up to the first one saying ``marker`` (read in a thread)."""
    got: list[str] = []
    for line in lines(proc):
        got.append(line.rstrip("\n"))
        if marker in line:
            return got
    proc.wait(30)
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"the change ended (exit {proc.returncode}) before {marker!r}: "
                         f"{got} {err}")


async def _at_least(aw: Any, n: int) -> bool:
    return (await aw) >= n


async def test_a_change_no_processor_finishes_exits_1_and_the_same_command_resumes_it(
    cfg: LogConfig, tmp_path: Path,
) -> None:
    sids = moving_ids(3, True)
    async with started(open_log(cfg)) as lg:
        proc = ProcessorProcess(cfg, "proc-a", tmp_path)
        try:
            async with Client(lg, reply_timeout=60) as client:
                for sid in sids:
                    await client.create_schedule("acme", sid, MANUAL)
        finally:
            proc.stop()
        first = repartition(cfg, "--to", str(NEW), "--timeout", "3")
        out, err = await asyncio.to_thread(first.communicate, timeout=120)
        assert first.returncode == 1, out + err
        assert "have not handed over within 3 s" in err and "run the same command" in err
        begun = await read_routing(lg)
        assert begun.migrating == RoutingVersion(2, NEW)
        assert (await lg.prefixed_topics())[lg.topics.events] == NEW

        # another count while this change is under way: refused, nothing written
        other = repartition(cfg, "--to", "36")
        out, err = await asyncio.to_thread(other.communicate, timeout=120)
        assert other.returncode == 2
        assert err.strip() == (f"error: --to: '36': a change to {NEW} partitions (version 2) "
                               f"is under way; finish it first with --to {NEW}")
        assert await read_routing(lg) == begun

        proc = ProcessorProcess(cfg, "proc-b", tmp_path)
        try:
            again = repartition(cfg, "--to", str(NEW), "--timeout", "120")
            out, err = await asyncio.to_thread(again.communicate, timeout=300)
            assert again.returncode == 0, out + err
            said = out.splitlines()
            assert said[0] == f"version 2 under way: {OLD} -> {NEW} partitions (going on)"
            assert said[-1] == f"version 2 complete: clients route by {NEW} partitions"
            async with Client(lg, reply_timeout=60) as client:  # served at the new homes
                for sid in sids:
                    assert (await client.trigger("acme", sid, "after"))["run_id"]
        finally:
            proc.stop()
        held = defaultdict(set)
        for p, _, e in await all_events(lg):
            if e.type == "KeyMovedIn":
                held[e.key].add(p)
        assert {k: sorted(v) for k, v in held.items()} == {
            partition_key("acme", s): [partition_for(partition_key("acme", s).encode(), NEW)]
            for s in sids}

        # nothing more to do, a count that shrinks, a count out of range
        same = repartition(cfg, "--to", str(NEW))
        out, err = await asyncio.to_thread(same.communicate, timeout=120)
        assert same.returncode == 0
        assert out.strip() == f"the deployment has {NEW} partitions (version 2): nothing to do"
        for bad, why in ((str(OLD), f"error: --to: '{OLD}': the partition count can only grow"),
                         ("0", "error: --to: '0': the partition count must be 1..1024"),
                         ("x", "error: --to: 'x': expected a whole number")):
            proc_bad = repartition(cfg, "--to", bad)
            out, err = await asyncio.to_thread(proc_bad.communicate, timeout=120)
            assert proc_bad.returncode == 2, (bad, out, err)
            assert why in err
        assert len(await read_history(lg)) == 3
