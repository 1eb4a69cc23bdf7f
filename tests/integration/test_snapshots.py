"""Takeover from a snapshot on both logs (docs/design.md §14): a processor writes its
partitions' states to the ``state`` topic; a new owner restores from it plus the tail of
``events`` and holds exactly what a fold of ``events`` from offset 0 gives — also after
the snapshot was damaged, is of another state version, was attempted by a fenced zombie,
or its writer was killed with kill -9 in the middle of writing it; and the audit of the log
still passes. A manual trigger repeated after such a takeover answers its run's final
state, the run long gone from the state (docs/design.md §3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from chronolog.audit.auditor import audit
from chronolog.client import Client
from chronolog.commands.state_codec import STATE_VERSION
from chronolog.domain import codec
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import Fenced, LogUnavailable, OutRecord, Record
from chronolog.processors import snapshots as sn
from chronolog.processors.config import ProcessorConfig, ProcessorStats
from chronolog.processors.restore import Restorer
from chronolog.settings import LogConfig, open_log
from support.polling import wait_until

from .conftest import log_url
from .takeovers import EVERY, Running, fold_from_zero, some_history, take_over

HERE = Path(__file__).resolve().parent
async def test_a_takeover_starts_from_the_snapshot_and_holds_the_fold_from_zero(
    event_log: Any,
) -> None:
    async with Running(event_log, "p1") as r:
        await some_history(r)
        await r.rounds(2)
    expected = await fold_from_zero(event_log)
    proc, states, takeovers = await take_over(event_log, "p2")
    assert states == expected
    assert sum(len(v) for v in states.values()) == 12 + 1  # and acme's quota aggregate
    assert all(t.from_snapshot and t.rejected is None for t in takeovers.values())
    assert proc.stats.restored_from_snapshot == event_log.topics.partitions
    total = sum(await _event_counts(event_log))
    assert sum(t.tail_events for t in takeovers.values()) < total / 2
    # with snapshots off, a takeover folds from offset 0 — to the same states
    _, states_off, takeovers_off = await take_over(event_log, "p3",
                                                     ProcessorConfig(snapshots=False))
    assert states_off == expected
    assert not any(t.from_snapshot for t in takeovers_off.values())
    assert sum(t.tail_events for t in takeovers_off.values()) == total


async def test_a_repeated_trigger_after_a_takeover_from_the_snapshot_answers_its_final_state(
    event_log: Any,
) -> None:
    spec = {"at": "2999-01-01T00:00:00Z", "job": {"type": "noop", "params": {}},
            "overlap": "allow"}
    async with Running(event_log, "p1") as r:
        await r.client.create_schedule("open", "m1", spec)

        async def succeeded(key: str) -> str:
            run_id: str = (await r.client.trigger("open", "m1", key))["run_id"]
            fence = (await r.client.claim("open", "m1", run_id, 1, "w1"))["fence"]
            await r.client.complete("open", "m1", run_id, 1, fence, "w1", "sha256:aa", 1)
            return run_id

        paid = await succeeded("pay-run")
        await succeeded("later-run")  # the newest finished run: "pay-run" left the state
        [home] = [p for p, ps in r.proc.partitions.items() if "open/m1" in ps.states]
        snap = r.proc.partitions[home].snap
        assert snap is not None
        want = snap.stats.rounds + 1  # a round since, and every change written
        await wait_until(lambda: snap.stats.rounds >= want and not snap.dirty
                         and snap.round is None, 60, what="the states in a snapshot")
    async with Running(event_log, "p2") as again:
        [takeover] = [t for t in again.proc.takeovers if t.partition == home]
        assert takeover.from_snapshot
        answer = await again.client.trigger("open", "m1", "pay-run")
    assert answer == {"run_id": paid, "state": "SUCCEEDED"}


async def _event_counts(lg: Any) -> list[int]:
    return [len(await _partition(lg, lg.topics.events, p)) for p in range(lg.topics.partitions)]


async def _partition(lg: Any, topic: str, p: int) -> list[Record]:
    out: list[Record] = []
    end = await lg.end_offset(topic, p)
    offset = 0
    while offset < end:
        recs = await lg.read(topic, p, offset, 2000)
        if not recs:
            break
        out.extend(recs)
        offset = recs[-1].offset + 1
    return out


def _latest_states(records: list[Record]) -> dict[bytes, Record]:
    latest: dict[bytes, Record] = {}
    for rec in records:
        if rec.key is not None and rec.key != sn.MARKER_KEY \
                and not rec.key.startswith(sn.SPEC_KEY_PREFIX):
            latest[rec.key] = rec
    return latest


async def test_a_damaged_or_other_version_snapshot_is_ignored_and_the_fold_starts_at_zero(
    event_log: Any,
) -> None:
    async with Running(event_log, "p1") as r:
        await some_history(r)
        await r.rounds(1)
    t = event_log.topics
    parts = [p for p in range(t.partitions) if _latest_states(await _partition(event_log,
                                                                                t.state, p))]
    assert len(parts) >= 2
    damaged, other_version = parts[0], parts[1]
    victim = next(iter(_latest_states(await _partition(event_log, t.state, damaged)).values()))
    flipped = bytearray(victim.value)
    flipped[-2] ^= 0x20
    stale = next(iter(_latest_states(await _partition(event_log, t.state,
                                                      other_version)).values()))
    assert stale.key is not None
    kind, _, through, body = sn.unframe(stale.key, stale.value)
    await event_log.append([
        OutRecord(t.state, victim.key, bytes(flipped), partition=damaged),
        OutRecord(t.state, stale.key, sn.frame(stale.key, kind, STATE_VERSION + 1, through,
                                               body), partition=other_version),
    ])
    expected = await fold_from_zero(event_log)
    proc, states, takeovers = await take_over(event_log, "p2")
    assert states == expected
    assert proc.stats.snapshots_rejected == 2
    assert "checksum" in (takeovers[damaged].rejected or "")
    assert "version" in (takeovers[other_version].rejected or "")
    assert not takeovers[damaged].from_snapshot and not takeovers[other_version].from_snapshot
    others = [tk for p, tk in takeovers.items() if p not in (damaged, other_version)]
    assert all(tk.from_snapshot for tk in others)


async def test_a_fenced_zombie_cannot_publish_a_snapshot(event_log: Any, log_config: LogConfig,
                                                         ) -> None:
    async with Running(event_log, "p1") as r:
        await some_history(r)
        await r.rounds(1)
    t = event_log.topics
    written = [p for p in range(t.partitions)
               if _latest_states(await _partition(event_log, t.state, p))]
    p = written[0]
    before = await _partition(event_log, t.state, p)
    zombie = await event_log.acquire(p, "zombie")
    other = open_log(log_config)
    await other.start()
    try:
        await other.acquire(p, "newer")  # fences the zombie
        end = await event_log.end_offset(t.events, p)
        forged = []
        for key in _latest_states(before):  # every state gone, as of the end of events
            forged.append(OutRecord(t.state, key, sn.frame(key, sn.KIND_QUOTA, STATE_VERSION,
                                                           end, b'["x", []]'), partition=p))
        forged.append(OutRecord(t.state, sn.MARKER_KEY, sn.frame(
            sn.MARKER_KEY, sn.KIND_MARKER, STATE_VERSION, end,
            b'{"fold_from": %d, "last_event": null}' % end), partition=p))
        with pytest.raises(Fenced):
            await zombie.commit([], {}, "processors", then=lambda _: forged)
        assert [(x.key, x.value) for x in await _partition(event_log, t.state, p)] == \
            [(x.key, x.value) for x in before]
    finally:
        await zombie.close()
        await other.close()
    expected = await fold_from_zero(event_log)
    _, states, takeovers = await take_over(event_log, "p2")
    assert states == expected
    assert takeovers[p].from_snapshot and takeovers[p].rejected is None


async def test_kill_9_while_writing_snapshots_then_a_new_owner_restores_exactly(
    log_config: LogConfig, event_log: Any, tmp_path: Path,
) -> None:
    """The writer is killed while it writes rounds of 2 states per transaction, every 50 ms,
    over 120 schedules that change every second: whatever it left, the new owner restores
    the fold from zero, and the audit of the log passes."""
    t = log_config.topics
    child = subprocess.Popen(
        [sys.executable, str(HERE / "snapshot_processor.py"), log_url(log_config), t.prefix,
         str(t.partitions), "writer"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "writer.log", "wb"), env=os.environ)
    try:
        async with Client(event_log, reply_timeout=60) as client:
            results = await client.create_schedules(
                "open", [(f"k{i}", EVERY) for i in range(120)])
            assert all(isinstance(x, dict) for x in results)

        async def rounds() -> list[int]:
            """The round number of each partition's latest marker (0: none yet)."""
            out = []
            for p in range(t.partitions):
                found = [x for x in await _partition(event_log, t.state, p)
                         if x.key == sn.MARKER_KEY]
                out.append(orjson.loads(sn.unframe(sn.MARKER_KEY, found[-1].value)[3])["round"]
                           if found else 0)
            return out

        await wait_until(lambda: _all_at_least(rounds(), 3), 60, what="3 rounds everywhere")
        os.kill(child.pid, signal.SIGKILL)  # rounds of ~15 transactions: mid-round
        child.wait(10)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
    expected = await fold_from_zero(event_log)
    proc, states, takeovers = await take_over(event_log, "p2")
    assert states == expected
    assert sum(len(v) for v in states.values()) == 120
    assert proc.stats.snapshots_rejected == 0
    assert any(tk.from_snapshot for tk in takeovers.values())
    evs = [(p, r.offset, codec.decode_event(r.value)) for p in range(t.partitions)
           for r in await _partition(event_log, t.events, p)]
    report = audit(evs)
    assert report.ok, report.violations[:5]
    assert report.schedules == 120


async def _all_at_least(aw: Any, n: int) -> bool:
    return all(x >= n for x in await aw)


async def test_the_audit_of_a_log_taken_over_from_snapshots_passes(event_log: Any) -> None:
    """The audit reads ``events`` only, from offset 0: a log whose takeovers went through
    snapshots (its state topic full of records) audits clean."""
    async with Running(event_log, "p1") as r:
        await some_history(r)
        await r.rounds(1)
    async with Running(event_log, "p2") as r2:
        assert all(tk.from_snapshot for tk in r2.proc.takeovers)
        await r2.client.trigger("acme", "s5", "after-takeover")
        await r2.rounds(1)
    t = event_log.topics
    numbered = [(p, x.offset, codec.decode_event(x.value)) for p in range(t.partitions)
                for x in await _partition(event_log, t.events, p)]
    report = audit(numbered)
    assert report.ok, report.violations[:5]
    assert [p for p in range(t.partitions) if await _partition(event_log, t.state, p)]


class _NoAnswerOnce:
    """The real log, except that its first ``partitions_for`` does not answer (a broker
    that times out once, as under load)."""

    def __init__(self, lg: Any) -> None:
        self._lg = lg
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lg, name)

    async def partitions_for(self, topic: str) -> int:
        if not self.failed:
            self.failed = True
            raise LogUnavailable(f"{topic}: no answer within the bound")
        n: int = await self._lg.partitions_for(topic)
        return n


async def test_a_log_that_does_not_answer_once_does_not_turn_snapshots_off(
    event_log: Any,
) -> None:
    flaky = _NoAnswerOnce(event_log)
    restorer = Restorer(flaky, flaky.topics, ProcessorConfig(), ProcessorStats(),
                        DeadLetters(flaky, "processor"), "p-flaky")
    with pytest.raises(LogUnavailable):  # this take-over fails, and is tried again
        await restorer.snapshots_usable()
    assert await restorer.snapshots_usable() is True
