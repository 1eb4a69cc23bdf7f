"""The processor: the single writer of its partitions of ``events``.

A ``Processor`` joins the consumer group on ``commands``. For each assigned partition p it
acquires ownership (a Kafka transactional producer ``<prefix>processor-p<p>``, or a SQLite
epoch), which fences any previous owner; restores state from partition p's snapshot on
``state`` plus the tail of ``events`` after it — or, without a usable snapshot, by folding
partition p of ``events`` from offset 0 (``chronolog.processors.snapshots``, docs/design.md
§14); and rebuilds its reply cache from the tail of partition p of ``replies``. While it
owns p it writes p's snapshot: chunks of the states changed since the last round, in its
own transactions, while idle or when a round is overdue. Then it loops: take
a batch of commands, decide each against its schedule's state, give itself ``Tick`` commands
for schedules whose timers are due, and commit the events, ready hints, dead letters, replies
and the consumed command offsets in ONE transaction per partition per batch.

Timers are a heap of (wake instant, key) per partition, fed by ``next_wakeup(state)`` after
every decision — never a scan of all schedules; an idle partition costs nothing.

A ``Fenced`` commit means a newer owner exists: the partition's state and owner are dropped
at once and nothing more is written for it (its batch is invisible to read_committed readers).

Pipelining: while the transactions of batch N are in flight (I/O: fsync, broker round
trips), the processor already polls and decides batch N+1 against the state batch N left
behind (the state is always ahead of the log while a commit is open — as before). Batch N+1
is only *committed* after every transaction of batch N finished, so a partition's
transactions stay strictly ordered; if one of batch N failed, that partition is dropped and
its batch N+1 is discarded (never written), and it is rebuilt from the log. A duplicate of a
command whose reply is still in flight is answered once that reply's positions are known.

When the log offers ``commit_many`` (SQLite: one database transaction, one fsync, each
owner's epoch still checked), one writer loop commits: whatever was decided while its
commit was in flight (any number of polls, any partitions) is queued and committed right
after it, all in one ``commit_many`` — the loop keeps deciding instead of waiting for the
writer, and a busy log gets fewer, larger commits (measured on the mixed benchmark: the
event loop sat idle about 40% of the time when batch N+1 waited for batch N's commit).
A partition whose commit failed is dropped, so its queued work is discarded, never written.
Past ``max_held`` queued commands the loop waits for the writer (backpressure).

Otherwise (Kafka: one producer per partition) each partition has
its own commit chain, independent of the other partitions — a slow transaction on one
partition delays only that partition's commands (no barrier across the partitions of a
poll). A partition has at most one transaction in flight: records that arrive for it
meanwhile are held, and when the transaction finishes the chain itself decides everything
held (plus due timers) as the partition's next batch and commits it — so a busy partition
gets fewer, larger transactions instead of a queue of small ones (measured: queueing up to
8 small transactions per partition doubled the p99). Past ``max_held`` held records the
loop waits for that partition (backpressure).

GC: ``ProcessorConfig.gc_tuning`` (default on) raises the first-generation threshold while
the processor runs and freezes the restored state, so the collector does not rescan the
growing, long-lived schedule states on every few thousand allocations (about 30-40% of the
processor's CPU with Python's defaults).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from chronolog.backoff import Backoff
from chronolog.commands.registry import PartitionAggregates
from chronolog.domain import messages as m
from chronolog.domain.offers import is_offer
from chronolog.environment import gc_tune as _gc_tune
from chronolog.environment import gc_tuned, utc_now
from chronolog.environment import gc_untune as _gc_untune
from chronolog.lifecycle import unavailable
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog, Fenced, LogError, Record
from chronolog.log.routing_history import read_routing
from chronolog.logging import Throttle
from chronolog.processors.clock import ClockGuard
from chronolog.processors.config import OpenTenants, ProcessorConfig, ProcessorStats, TenantPolicies
from chronolog.processors.output import Output
from chronolog.processors.partition_task import PartitionTask, TaskContext, Unapplied
from chronolog.processors.pruning import Pruner
from chronolog.processors.restore import Restorer, Takeover
from chronolog.settings import installed_rules
from chronolog.wakeup import wait_within

log = structlog.get_logger("chronolog.processor")

# between tries to take a partition over while the log does not answer (acquire, restore)
TAKEOVER_BACKOFF = Backoff(first=0.5, cap=5.0)
# How long a rebalance callback waits for its take-overs before it returns (the group's
# heartbeats wait for it: under half the session timeout); the rest go on in the background
TAKEOVER_INLINE_S = 4.0
RESTORE_SLOTS = 2  # partitions restored at the same time
# A partition revoked while it is restored keeps its restore this long, in case the group
# gives it back (members joining one after another move partitions back and forth), then the
# restore stops and frees its slot: processors started together each took every partition
# for a moment, and at 10,000,000 schedules the first joiner then folded two partitions it
# no longer owned for 400 s before it began on its own
ABANDONED_RESTORE_S = 10.0


class Processor:
    """Owns partitions of ``commands``/``events`` and decides their commands."""

    def __init__(
        self,
        log_: EventLog,
        member_id: str,
        tenants: TenantPolicies | None = None,
        config: ProcessorConfig | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.log = log_
        self.topics = log_.topics
        self.member_id = member_id
        self.tenants = tenants or OpenTenants()
        self.config = config or ProcessorConfig()
        # the processor's time: ``clock`` with its steps held (chronolog.processors.clock)
        cfg = self.config
        self.clock_guard = None if cfg.clock_step_s is None else ClockGuard(
            clock, bound_s=cfg.clock_step_s, hold_s=cfg.clock_step_hold_s)
        self.clock = clock if self.clock_guard is None else self.clock_guard
        self.rules = self.config.rules or installed_rules()
        self.takeovers: deque[Takeover] = deque(maxlen=256)  # the latest, newest last
        self.group = self.topics.processor_group
        self.partitions: dict[int, PartitionTask] = {}
        self.stats = ProcessorStats()
        self._stopping = asyncio.Event()
        self._consumer: Any = None
        self._inflight: asyncio.Task[None] | None = None  # the writer loop (commit_many)
        self._queued: list[_Work] = []  # decided, waiting for the writer loop
        self._rebuild: list[int] = []  # partitions to take over again (commit failed)
        self._fenced_out: dict[int, float] = {}  # partition -> when to check it again
        # commit chains of dropped partitions that may still be running (waited at shutdown)
        self._orphans: list[asyncio.Task[None]] = []
        self.on_commit: list[Callable[[int, list[m.EventEnvelope]], None]] = []
        self.dead_letters = DeadLetters(log_, "processor")
        # what its partition tasks share, and how a partition taken over is restored
        self._tasks = TaskContext(self.topics, self.config, self.tenants, self.stats,
                                  member_id, self.rules, self.dead_letters, self.partitions)
        self._restorer = Restorer(log_, self.topics, self.config, self.stats,
                                  self.dead_letters, member_id, lambda: self.clock())
        # partition -> why its last commit or take-over failed (until one succeeds)
        self._failed: dict[int, str] = {}
        # partition -> (failed take-overs in a row, monotonic time of the next try)
        self._retake: dict[int, tuple[int, float]] = {}
        self._throttle = Throttle()
        # partitions being taken over in the background -> the task (``_on_assigned``), and
        # the outcomes it produced since: (partition, (state, take-over, committed offset) |
        # the exception | None when revoked before its turn)
        self._restoring: dict[int, asyncio.Task[None]] = {}
        self._restored: list[tuple[int, Any]] = []
        self._closing: set[asyncio.Task[None]] = set()  # owners of discarded take-overs
        self._abandoned: set[int] = set()  # revoked while being restored: not installed
        self._stopped: set[int] = set()  # abandoned restores cancelled (``_stop_abandoned``)
        self.abandoned_restore_s = ABANDONED_RESTORE_S
        self._restore_slots = asyncio.Semaphore(RESTORE_SLOTS)
        # partitions installed since this step's poll began -> the offset they were sought to
        self._installed: dict[int, int] = {}
        # pruning of the owned partitions (chronolog.processors.pruning), beside the loop
        cfg = self.config
        self.pruner = Pruner(log_, retention_s=cfg.retention_s, archive=cfg.archive,
                             transient_s=cfg.transient_s)

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the loop to finish its open batch and leave the group."""
        self._stopping.set()

    def readiness(self) -> tuple[bool, str]:
        """Ready: in the group, every partition assigned to it restored, and the last commit
        attempt of each succeeded (``chronolog.readiness``); else what it waits for."""
        consumer = self._consumer
        if consumer is None or self._stopping.is_set():
            return False, "stopping" if self._stopping.is_set() else "starting"
        if not consumer.joined():
            return False, "not in the processors group (joining, or the log is away)"
        assigned = sorted(p for t, p in consumer.assignment() if t == self.topics.commands)
        failed = [p for p in assigned if p in self._failed]
        if failed:
            return False, f"partition {failed[0]}: {self._failed[failed[0]]}"
        waiting = [p for p in assigned if p not in self.partitions]
        if waiting:
            return False, f"restoring partitions {waiting}"
        return True, (f"owns partitions {assigned}" if assigned
                      else "in the processors group, owns no partition")

    async def run(self) -> None:
        """Run until ``stop()``; then finish the open transactions and leave the group."""
        self._consumer = self.log.group_consumer(
            self.group,
            [self.topics.commands],
            self.member_id,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            settle_s=self.config.group_settle_s,
        )
        tuned = False
        try:
            if self.config.gc_tuning:
                _gc_tune(self.config.gc_gen0_threshold)
                tuned = True
            await self._consumer.start()
            pruning = (asyncio.create_task(self._prune_until_stopped(), name="pruning")
                       if self.config.prune else None)
            try:
                while not self._stopping.is_set():
                    await self.step()
            finally:
                if pruning is not None:
                    pruning.cancel()
                    await _within(asyncio.wait({pruning}), self.config.shutdown_s, "pruning")
        finally:
            try:  # the open transactions finish first, within the shutdown bound
                await _within(self._settle(rebuild=False), self.config.shutdown_s,
                              "transactions in flight")
            finally:
                restoring = set(self._restoring.values())
                for task in restoring:
                    task.cancel()
                if restoring:
                    await _within(asyncio.wait(restoring), self.config.shutdown_s,
                                  "take-overs being restored")
                for _, outcome in self._restored:
                    if isinstance(outcome, tuple):
                        self._discard_owner(outcome[0])
                self._restoring, self._restored = {}, []
                await self._consumer.close()
                for ps in list(self.partitions.values()):
                    await self._drop(ps.partition, "shutdown")
                if self._closing:
                    await asyncio.gather(*self._closing, return_exceptions=True)
                if tuned:
                    _gc_untune()

    async def _prune_until_stopped(self) -> None:
        """A pruning pass over every owned partition every ``prune_every_s``; a failure is
        logged and tried again at the next pass: pruning never stops deciding."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_within(self._stopping.wait(), self.config.prune_every_s)
            try:
                checkpoint = await self.pruner.checkpoint() if self.partitions else None
            except Exception as exc:  # noqa: BLE001 - tried again at the next pass
                log.warning("prune_failed", error=repr(exc)[:500])
                continue
            for p, ps in list(self.partitions.items()):
                if self._stopping.is_set():
                    return
                snap = ps.snap
                try:
                    await self.pruner.prune(p, None if snap is None
                                            else snap.takeover_reads_from(), checkpoint)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - tried again at the next pass
                    self.pruner.stats.failures += 1
                    log.warning("prune_failed", partition=p, error=repr(exc)[:500])

    async def step(self) -> None:
        """One iteration: a batch of commands plus due timers, one transaction per partition.

        Decides while the previous iteration's transactions are still in flight (see the
        module docstring), then waits for those before launching its own.
        """
        if self._restored:
            self._install_restored()  # before the poll: their records flow from the seek
        self._installed.clear()
        timeout = self._poll_timeout()
        records = await self._consumer.getmany(timeout_ms=timeout,
                                               max_records=self.config.batch_max)
        now = self.clock()
        by_partition: dict[int, list[Record]] = {}
        for rec in records:
            by_partition.setdefault(rec.partition, []).append(rec)
        # nothing to decide anywhere: the moment for snapshot chunks (otherwise only an
        # overdue snapshot round gets one: a burst of runs is not slowed by snapshots)
        idle = not records and not any(
            ps.held or ps.running() or ((nw := ps.next_wake()) is not None and nw <= now)
            for ps in self.partitions.values())
        chains = self._chains()
        if chains:
            await self._take_over_again()
        self._reread_installed(by_partition)
        work: list[_Work] = []
        for p, ps in list(self.partitions.items()):
            batch = by_partition.get(p, [])
            chain = ps.running() if chains else None
            if chain is not None:
                ps.held.extend(batch)  # its chain decides them when its transaction ends
                if len(ps.held) > self.config.max_held:
                    await asyncio.wait([chain])  # backpressure
                continue
            if ps.held:
                batch, ps.held = ps.held + batch, []
            nw = ps.next_wake()
            if not batch and (nw is None or nw > now) and not ps.snapshot_due(idle):
                continue
            out, consumed = await self._decide(ps, batch, now, idle)
            if out is not None:
                work.append(_Work(ps, batch, out, consumed))
        if chains:
            for w in work:
                w.ps.chain = asyncio.create_task(self._chain(w))
            return
        # One writer loop: work decided while a commit is in flight is queued and committed
        # by the loop right after it, all of it in one commit (see the module docstring).
        self._queued.extend(work)
        task = self._inflight
        if task is None or task.done():
            await self._settle()  # the finished loop's failed partitions are taken over again
            if self._queued:
                self._inflight = asyncio.create_task(self._commit_queued())
        elif sum(len(w.batch) for w in self._queued) > self.config.max_held:
            await asyncio.shield(asyncio.wait([task]))  # backpressure
        if not self.config.pipeline:
            await self._settle()

    def _chains(self) -> bool:
        """Whether partitions commit through their own chains (module docstring)."""
        if not self.config.pipeline:
            return False
        if self.config.commit_chains is not None:
            return self.config.commit_chains
        return getattr(self.log, "commit_many", None) is None

    async def _chain(self, w: _Work) -> None:
        """A partition's commit chain: commit ``w``, then decide and commit what arrived
        meanwhile (held records, due timers), until nothing is left; never raises.

        If a transaction fails the partition is dropped (``_committed``) and the chain ends;
        its held records were never decided into a commit, so the next owner reads them again
        from the committed offset.
        """
        ps = w.ps
        while self.partitions.get(ps.partition) is ps:
            try:
                result: Any = await ps.owner.commit(w.out.records, w.consumed, self.group,
                                                    then=w.out.then)
            except Exception as exc:  # noqa: BLE001 - the outcome is handled as data
                result = exc
            try:
                await self._committed(w, result)
            except Exception:  # a chain task must not die with an unread error
                log.exception("commit_accounting_failed", partition=ps.partition)
            if self.partitions.get(ps.partition) is not ps:
                return
            batch, ps.held = ps.held, []
            now = self.clock()
            nw = ps.next_wake()
            if not batch and (nw is None or nw > now) and not ps.snapshot_due(False):
                return
            out, consumed = await self._decide(ps, batch, now, False)
            if out is None:
                return
            w = _Work(ps, batch, out, consumed)

    async def _settle(self, rebuild: bool = True) -> None:
        """Wait for the transactions in flight; take over again partitions whose commit failed."""
        task = self._inflight
        if task is not None:
            await asyncio.shield(task)  # cancelled while waiting: run()'s finally waits again
            if self._inflight is task:
                self._inflight = None
        chains = [t for t in (ps.running() for ps in list(self.partitions.values()))
                  if t is not None] + self._orphans
        if chains:
            await asyncio.shield(asyncio.wait(chains))
        self._orphans = [t for t in self._orphans if not t.done()]
        if not rebuild:
            return
        await self._take_over_again()

    async def _take_over_again(self) -> None:
        """Acquire again (restore + seek) the partitions whose commit failed, not fenced;
        those fenced that the group still assigns to us ``fenced_retry_s`` later; and those
        whose take-over failed (the log did not answer), after ``TAKEOVER_BACKOFF``."""
        again, self._rebuild = self._rebuild, []
        mono = time.monotonic()
        for p, when in list(self._fenced_out.items()):
            if when <= mono:
                del self._fenced_out[p]
                again.append(p)
        again.extend(p for p, (_, when) in self._retake.items() if when <= mono)
        for p in again:
            if (p not in self.partitions
                    and (self.topics.commands, p) in self._consumer.assignment()):
                await self._on_assigned({(self.topics.commands, p)})

    def _poll_timeout(self) -> int:
        # a busy partition's timers are its chain's business (no busy polling meanwhile)
        idle = [ps for ps in self.partitions.values() if ps.running() is None]
        poll_ms = self.config.poll_ms
        if len(idle) == len(self.partitions):
            if any(ps.snapshot_due(True) for ps in idle):
                return 0  # nothing in flight: a snapshot chunk goes out unless commands came
            if any(ps.snap is not None and ps.snap.round is not None for ps in idle):
                poll_ms = min(poll_ms, 5)  # a round's next chunk, once its writer is done
        if self._restoring:
            poll_ms = min(poll_ms, 20)  # a partition restored in the background: installed soon
        wakes = [w for w in (ps.next_wake() for ps in idle) if w is not None]
        if not wakes:
            return poll_ms
        delta = (min(wakes) - self.clock()).total_seconds() * 1000
        return int(max(0, min(poll_ms, delta)))

    # ------------------------------------------------------------------ ownership

    async def _on_assigned(self, tps: set[tuple[str, int]]) -> None:
        """Take over each assigned partition: acquire (fencing the previous owner), restore,
        seek. One the log does not let us take over now (it does not answer) stays without
        state and is tried again after ``TAKEOVER_BACKOFF`` (``_take_over_again``): a broker
        outage under load must not end the process, nor leave the partition unowned.

        The take-overs run in tasks of their own, awaited here for at most
        ``TAKEOVER_INLINE_S``: no heartbeat of the group goes out while a rebalance callback
        runs (aiokafka starts them once it returns), so a restore longer than the session
        timeout done here would get the member dropped from the group — and, taken over
        again from the start after rejoining, dropped again, for ever (a first fold of a
        long history). A partition still restoring then is installed by ``step`` once
        restored; its records are not decided before that (the seek at the install reads
        them again from the committed offset)."""
        if self._stopping.is_set():
            # leaving: the group hands out the partitions of the processors that left before
            # us; restoring them would only hold up our stop (the next owner restores them)
            return
        assigned_at = time.monotonic()
        ours = {p for topic, p in tps if topic == self.topics.commands}
        self._abandoned -= ours  # revoked while restoring, and given back: installed after all
        todo = sorted(p for p in ours if p not in self.partitions and p not in self._restoring)
        if todo:
            tasks = []
            for p in todo:
                task = asyncio.create_task(self._take_over_in_turn(p, assigned_at),
                                           name=f"take-over-{p}")
                self._restoring[p] = task
                tasks.append(task)
            await asyncio.wait(tasks, timeout=TAKEOVER_INLINE_S)
        self._install_restored()

    async def _take_over_in_turn(self, p: int, assigned_at: float) -> None:
        """Acquire and restore partition p once one of ``RESTORE_SLOTS`` is free (in the
        order of assignment: one long restore does not hold the others up, and a few at a
        time serve the first ones sooner than all at once); its outcome goes to
        ``_restored`` for ``_install_restored``."""
        async with self._restore_slots:
            if p in self._abandoned:
                self._restored.append((p, None))  # revoked before its turn: nothing to do
                return
            # the outcome first, then the append: ``self._restored`` is replaced by each
            # install, so the list must be looked up after the await, not before it
            outcome: Any
            try:
                outcome = await self._take_over(p, assigned_at)
            except asyncio.CancelledError:
                if p not in self._stopped:
                    raise  # the processor stops
                self._stopped.discard(p)
                outcome = None  # abandoned: its owner was closed by ``_take_over``
            except Exception as exc:  # noqa: BLE001 - handled at the install
                outcome = exc
            self._restored.append((p, outcome))

    def _stop_abandoned(self, p: int) -> None:
        """``abandoned_restore_s`` after partition p was revoked mid-restore: if it was not
        given back, stop its restore (the slot goes to a partition this processor owns)."""
        task = self._restoring.get(p)
        if p in self._abandoned and task is not None and not task.done():
            self._stopped.add(p)
            task.cancel()

    def _install_restored(self) -> None:
        """Install the partitions restored since the last call (seek to the committed
        offset: their records flow from there), note the take-overs that failed."""
        restored, self._restored = self._restored, []
        fatal: BaseException | None = None  # raised once the others are installed
        for p, outcome in restored:
            self._restoring.pop(p, None)
            abandoned = p in self._abandoned
            self._abandoned.discard(p)
            if outcome is None:
                # revoked before its turn or its restore stopped; given back meanwhile, it
                # is taken over again by the next step
                if not abandoned and (self.topics.commands, p) in self._consumer.assignment():
                    self._rebuild.append(p)
                continue
            if isinstance(outcome, BaseException):
                try:
                    self._take_over_failed(p, outcome)
                except BaseException as exc:  # noqa: BLE001 - not the log's: ends the run
                    fatal = fatal or exc
                continue
            ps, takeover, committed = outcome
            if abandoned:
                self._discard_owner(ps)  # revoked while it was restored
                continue
            self._consumer.seek(self.topics.commands, p, committed or 0)
            self._installed[p] = committed or 0
            # what is due now fell in the gap before this take-over: the first Tick of each
            # such schedule says so, ahead of its commands (``PartitionTask.resume``)
            ps.resume(self.clock())
            self.partitions[p] = ps
            self._failed.pop(p, None)  # taken over: its next commit tells
            self._retake.pop(p, None)
            takeover.restored_at = time.monotonic()
            self.takeovers.append(takeover)
            log.info("partition_assigned", partition=p, schedules=len(ps.states),
                     cold=takeover.cold, hot_peak=takeover.hot_peak,
                     events_offset=ps.events_offset, commands_offset=committed or 0,
                     from_snapshot=takeover.from_snapshot, tail_events=takeover.tail_events,
                     restore_s=round(takeover.restored_at - takeover.assigned_at, 3))
        if restored and self.config.gc_tuning and gc_tuned():
            gc.freeze()  # the restored states are long-lived: keep them out of collections
        if fatal is not None:
            raise fatal

    def _reread_installed(self, by_partition: dict[int, list[Record]]) -> None:
        """A partition installed while this step polled, or after (a rebalance callback, a
        take-over again): the records polled for it may predate its seek — they are left
        undecided and the partition is sought to its committed offset again (nothing was
        decided for it since the install), so they are read again in order."""
        for p, committed in self._installed.items():
            if by_partition.pop(p, None) is not None:
                self._consumer.seek(self.topics.commands, p, committed)

    def _take_over_failed(self, p: int, exc: BaseException) -> None:
        if not (unavailable(exc) or isinstance(exc, LogError)):
            raise exc
        tries = self._retake.get(p, (0, 0.0))[0] + 1
        wait = TAKEOVER_BACKOFF.delay(tries)
        self._retake[p] = (tries, time.monotonic() + wait)
        self._failed[p] = f"take-over failed: {type(exc).__name__}: {exc}"[:300]
        held = self._throttle.take(f"takeover-{p}")  # a few lines per outage
        if held is not None:
            log.warning("partition_takeover_failed", partition=p, tries=tries,
                        retry_in_s=wait, error=f"{type(exc).__name__}: {exc}"[:300],
                        **({"held_back": held} if held else {}))

    def _discard_owner(self, ps: PartitionTask) -> None:
        task = asyncio.create_task(ps.owner.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _take_over(self, p: int, assigned_at: float | None = None
                         ) -> tuple[PartitionTask, Takeover, int | None]:
        """Acquire partition p (fencing its previous owner) and restore its state: the
        partition, its take-over record and the group's committed offset of p."""
        if assigned_at is None:
            assigned_at = time.monotonic()
        table = self.config.routing or await read_routing(self.log)
        takeover = Takeover(p, assigned_at)
        owner = await self.log.acquire(p, self.member_id)  # fences the previous owner
        if hasattr(owner, "await_visible"):  # a log adapter that can skip that wait
            owner.await_visible = self.config.await_visible
        ps = PartitionTask(p, owner, self._tasks, PartitionAggregates.of_partition(p, table))
        try:
            await self._restore(ps, takeover)
            committed = await self.log.committed(self.group, self.topics.commands, p)
        except BaseException:
            with contextlib.suppress(Exception):
                await owner.close()
            raise
        return ps, takeover, committed

    async def _on_revoked(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in sorted(tps):
            if topic == self.topics.commands:
                self._retake.pop(p, None)  # its next owner takes it over
                self._failed.pop(p, None)
                if p in self._restoring:
                    self._abandoned.add(p)
                    asyncio.get_running_loop().call_later(
                        self.abandoned_restore_s, self._stop_abandoned, p)
            ps = self.partitions.get(p)
            if topic == self.topics.commands and ps is not None:
                chain = ps.running()
                if chain is not None:  # what it decided commits first
                    await asyncio.shield(asyncio.wait([chain]))
                await self._drop(p, "revoked")

    async def _drop(self, p: int, why: str) -> None:
        ps = self.partitions.pop(p, None)
        if ps is None:
            return
        chain = ps.running()
        if chain is not None:
            self._orphans.append(chain)  # it sees the drop and writes nothing more
        try:
            await ps.owner.close()
        except Exception:  # noqa: BLE001 - the owner is being discarded either way
            pass
        if self.config.gc_tuning and gc.get_freeze_count():
            gc.unfreeze()  # let the collector reclaim the dropped state (frozen again later)
        log.info("partition_dropped", partition=p, reason=why)

    async def _restore(self, ps: PartitionTask, takeover: Takeover | None = None) -> None:
        """Rebuild partition p's states, timers, dispatch queue and replies
        (``Restorer.restore``)."""
        await self._restorer.restore(ps, takeover)

    # ------------------------------------------------------------------ the batch

    async def _decide(
        self, ps: PartitionTask, batch: list[Record], now: datetime, idle: bool = False,
    ) -> tuple[Output | None, dict[tuple[str, int], int]]:
        """``PartitionTask.decide``; when a decision could not be applied to the state (a bug in
        ``evolve``), the state is no longer the log's: the partition is dropped and taken
        over again from the log, and the command at fault is dead-lettered when it is read
        again (the timer at fault is not armed again), so it cannot stop the partition twice.
        """
        try:
            return ps.decide(batch, now, idle)
        except Unapplied as exc:
            self.stats.apply_errors += 1
            log.error("decision_not_applied", partition=ps.partition, error=str(exc))
            if await self._discard(ps, "a decision could not be applied"):
                self._rebuild.append(ps.partition)
            return None, {}

    async def _commit_queued(self) -> None:
        """The writer loop (logs with ``commit_many``): commit everything queued, in order,
        until the queue is empty; never raises.

        A partition dropped meanwhile (its commit failed, fenced, revoked) has its queued
        work discarded: it was decided on a state that is gone, and its commands were not
        consumed, so whoever owns the partition next reads them again.
        """
        while self._queued:
            work, self._queued = self._queued, []
            work = [w for w in work if self.partitions.get(w.ps.partition) is w.ps]
            if work:
                await self._commit_all(work)

    async def _commit_all(self, work: list[_Work]) -> None:
        """Commit every partition's transaction of one batch; never raises.

        With a log that has ``commit_many`` (SQLite) the partitions commit in ONE database
        transaction (one fsync; each owner's epoch is still checked, a fenced owner's part is
        left out); otherwise each partition's transaction runs concurrently.
        """
        results: list[Any]
        many = getattr(self.log, "commit_many", None)
        if many is not None and len(work) > 1:
            try:
                results = list(await many([
                    (w.ps.owner, w.out.records, w.consumed, self.group, w.out.then) for w in work
                ]))
            except Exception as exc:  # noqa: BLE001 - every partition's outcome is unknown
                results = [exc] * len(work)
        else:
            results = await asyncio.gather(*(
                w.ps.owner.commit(w.out.records, w.consumed, self.group, then=w.out.then)
                for w in work
            ), return_exceptions=True)
        for w, res in zip(work, results, strict=True):
            await self._committed(w, res)

    async def _committed(self, w: _Work, result: Any) -> None:
        """Account for one partition's transaction (``result``: positions or the exception).

        The live state was evolved while deciding; if the transaction did not commit, that
        state is ahead of the log, so the partition is dropped — and, unless we were fenced,
        taken over again from the log (restore + seek to the committed offset) by ``_settle``.
        """
        ps, out = w.ps, w.out
        if isinstance(result, BaseException):
            self._failed[ps.partition] = (f"last commit failed: {type(result).__name__}: "
                                          f"{result}")[:300]
        else:
            self._failed.pop(ps.partition, None)
        if isinstance(result, Fenced):
            self.stats.fenced += 1
            log.warning("partition_fenced", partition=ps.partition, error=str(result))
            if await self._discard(ps, "fenced"):
                self._fenced_out[ps.partition] = time.monotonic() + self.config.fenced_retry_s
            return
        if isinstance(result, BaseException):  # unknown outcome: rebuild from the log
            log.warning("partition_commit_failed", partition=ps.partition, error=repr(result))
            if await self._discard(ps, "commit failed"):
                self._rebuild.append(ps.partition)
            return
        self.stats.transactions += 1
        offers = sum(1 for rec in w.batch if rec.headers and is_offer(rec.headers))
        self.stats.offers += offers
        self.stats.commands += len(w.batch) - offers
        self.stats.events += len(out.events)
        if out.chunk is not None and ps.snap is not None:
            ps.snap.committed(out.chunk)
        wall = time.time()
        for cid, data in out.final.items():
            ps.replies[cid] = (wall, data)
            ps.replies.move_to_end(cid)
            if ps.pending.get(cid) is out:
                del ps.pending[cid]
        while len(ps.replies) > self.config.reply_cache_size:
            ps.replies.popitem(last=False)
        if self.on_commit:
            envelopes = out.envelopes()
            for hook in self.on_commit:
                hook(ps.partition, envelopes)

    async def _discard(self, ps: PartitionTask, why: str) -> bool:
        """Drop ``ps`` if it is still the live state of its partition (True when dropped)."""
        if self.partitions.get(ps.partition) is not ps:
            return False
        await self._drop(ps.partition, why)
        return True


@dataclass
class _Work:
    """One partition's decided batch, waiting for (or in) its transaction."""

    ps: PartitionTask
    batch: list[Record]
    out: Output
    consumed: dict[tuple[str, int], int]


async def _within(work: Coroutine[Any, Any, Any], seconds: float, what: str) -> None:
    """Await ``work`` at most ``seconds`` (the processor's stop); past the bound it is
    cancelled and not waited for, logged with where it stood. Its failure is logged too: a
    stop goes on whatever its parts do."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        where = io.StringIO()
        task.print_stack(limit=12, file=where)
        task.cancel()
        log.warning("stop_abandoned", what=what, after_s=seconds, stack=where.getvalue()[-3000:])
        return
    if not task.cancelled() and task.exception() is not None:
        log.warning("stop_failed", what=what, error=repr(task.exception())[:500])
