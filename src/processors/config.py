"""What a processor is configured with and what it counts: its tuning
(``ProcessorConfig``), the tenants' policies it enforces (``TenantPolicies``, with
``OpenTenants`` for a single-user node) and its counters (``ProcessorStats``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from chronolog.commands.aggregate import OPEN_TENANT, TenantContext
from chronolog.domain.limits import (
    DEFAULT_EXECUTION_TIMEOUT_SECONDS,
    MAX_RETRY_ATTEMPTS,
    MIN_INTERVAL_SECONDS,
    MIN_RETRY_BACKOFF_SECONDS,
)
from chronolog.domain.messages import ConcurrencySpec
from chronolog.domain.routing import RoutingTable
from chronolog.settings import RulesVersion
from chronolog.tenants import DEFAULT_RETENTION_S


class TenantPolicies(Protocol):
    """Where a processor learns a tenant's allowed job types, schedule quota, minimum
    interval and the effect destinations (name -> kind) the operator granted it."""

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]: ...

    def min_interval(self, tenant: str) -> float: ...

    def destinations(self, tenant: str) -> Mapping[str, str] | None: ...

    def weight(self, tenant: str) -> float: ...

    def seat_pools(self, tenant: str) -> frozenset[str | None]: ...

    def credentials(self, pool: str) -> tuple[str, ...]: ...

    def retry_bounds(self, tenant: str) -> tuple[int, float]: ...

    def max_running(self, tenant: str) -> int | None: ...

    def timeouts(self, tenant: str) -> tuple[float, dict[str, float]]: ...

    def attempts_per_minute(self, tenant: str) -> int | None: ...

    def storage_budget(self, tenant: str) -> int | None: ...

    def job_concurrency(self, tenant: str) -> Mapping[str, ConcurrencySpec]: ...


def tick_context(tenants: TenantPolicies, tenant: str) -> TenantContext:
    """What a Tick needs of the tenant's policy: its concurrency rules per job type (a run
    the Tick makes READY asks for a permit), else nothing."""
    rules = tenants.job_concurrency(tenant)
    return TenantContext(job_concurrency=rules) if rules else OPEN_TENANT


def claim_context(tenants: TenantPolicies, tenant: str) -> TenantContext:
    """What an assignment (a ClaimRun on a worker's behalf) needs of the tenant's policy:
    its execution timeouts, written into AttemptClaimed and the record."""
    timeout, job_timeouts = tenants.timeouts(tenant)
    return TenantContext(execution_timeout=timeout, job_timeouts=job_timeouts,
                         job_concurrency=tenants.job_concurrency(tenant))


class OpenTenants:
    """Every tenant may run every job, with no quota (embedded single-user default).

    Effect destinations are not checked here (None): the effect runner, which resolves each
    destination from the tenants file when it performs an effect, refuses any not granted.
    """

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]:
        return (None, None)

    def min_interval(self, tenant: str) -> float:
        return MIN_INTERVAL_SECONDS

    def destinations(self, tenant: str) -> Mapping[str, str] | None:
        return None

    def weight(self, tenant: str) -> float:
        return 1.0

    def seat_pools(self, tenant: str) -> frozenset[str | None]:
        return frozenset({None})  # no pools: pool-less workers only

    def credentials(self, pool: str) -> tuple[str, ...]:
        return ()  # no pool is known: every pool offer is refused

    def retry_bounds(self, tenant: str) -> tuple[int, float]:
        return (MAX_RETRY_ATTEMPTS, MIN_RETRY_BACKOFF_SECONDS)

    def max_running(self, tenant: str) -> int | None:
        return None

    def timeouts(self, tenant: str) -> tuple[float, dict[str, float]]:
        return (DEFAULT_EXECUTION_TIMEOUT_SECONDS, {})

    def attempts_per_minute(self, tenant: str) -> int | None:
        return None

    def storage_budget(self, tenant: str) -> int | None:
        return None

    def job_concurrency(self, tenant: str) -> Mapping[str, ConcurrencySpec]:
        return {}


# ``chronolog processor``'s ``group_settle_s``: the processes of a deployment started
# together join within about a second of each other (Kafka's broker default waits 3 s)
GROUP_SETTLE_S = 1.0


@dataclass
class ProcessorConfig:
    batch_max: int = 500
    poll_ms: int = 50
    # due timers decided per iteration, shared by the owned partitions: a burst of instants
    # goes out in several smaller transactions, so its first runs start a few ms after T
    ticks_per_step: int = 300
    reply_cache_size: int = 10_000
    reply_retention_s: float = 3600.0
    # the log's window (``--retention``, or a tenant's own when longer): events younger
    # than this before a partition's newest are never pruned (chronolog.processors.pruning)
    retention_s: float = DEFAULT_RETENTION_S
    # pruning the owned partitions of events and the transient topics, every prune_every_s
    # (off: the log keeps everything); archive: where events go before they are removed
    prune: bool = True
    prune_every_s: float = 30.0
    transient_s: float = 3600.0
    archive: str | None = None
    restore_chunk: int = 2000
    # pipelining: decide batch N+1 while batch N's transactions are in flight
    pipeline: bool = True
    # per-partition commit chains: None = when the log has no commit_many (Kafka); True /
    # False force them on / off (off: the one writer loop, as with commit_many)
    commit_chains: bool | None = None
    # with chains: records held for a partition whose transaction is in flight before the
    # loop waits for it; with commit_many: commands queued for the writer loop
    max_held: int = 5000
    # raise gen-0 GC threshold during run() and gc.freeze() the restored state
    gc_tuning: bool = True
    gc_gen0_threshold: int = 50_000
    # Kafka: return from a commit without waiting until committed readers see it (nothing
    # on the processor's path reads its own writes back; see chronolog.log.kafka)
    await_visible: bool = False
    # a partition this processor was fenced out of, yet its group still assigns to it after
    # this long (the fencer's view of the group changed meanwhile and it let the partition
    # go), is acquired again instead of staying without an owner
    fenced_retry_s: float = 5.0
    # a group of processors that forms (all of them started together) is assigned its
    # partitions once no member has joined for this long, so that the first to join does not
    # take over every partition and hand most of them back a moment later (the SQLite log's
    # groups: ``chronolog.log.sqlite``, "Consumer groups"; on Kafka the broker's
    # group.initial.rebalance.delay.ms does the same). 0: at once.
    group_settle_s: float = 0.0
    # at stop: the longest wait for the transactions in flight and the take-overs being
    # restored; what is still running then is abandoned (its transaction is aborted by the
    # partition's next owner, which fences this producer; chronolog.lifecycle)
    shutdown_s: float = 30.0
    # snapshots of the owned partitions' states on the ``state`` topic (docs/design.md §14,
    # chronolog.processors.snapshots): a takeover reads them plus the tail of ``events``
    # instead of folding ``events`` from offset 0. Off: fold from 0 and write none.
    snapshots: bool = True
    # a round of the dirty states when the processor is idle, at most this often ...
    snapshot_interval_s: float = 5.0
    # ... and while it is busy, once the last round started this long ago, or after this
    # many events since (a burst of runs is not slowed by snapshots; the tail a takeover
    # folds stays bounded under sustained load)
    snapshot_busy_interval_s: float = 30.0
    snapshot_events: int = 100_000
    snapshot_chunk: int = 256  # states encoded per batch (one chunk per transaction)
    state_read_batch: int = 10_000  # records per read of the state topic at takeover
    # schedules held cold (chronolog.processors.schedule_store: their sealed bytes, about
    # 400 B, instead of about 1.8 KB as objects): every quiet one whose wake-up is further
    # away than this, warmed this long ahead of it. None: every state stays an object
    hot_horizon_s: float | None = 900.0
    cool_every_s: float = 5.0  # how often the states changed since are looked at
    # per decide of a partition: states looked at to cool, states warmed (a wave of
    # instants a horizon ahead is warmed in slices, not in one turn of the event loop)
    cool_per_step: int = 5000
    warm_per_step: int = 2000
    # a take-over's fold (from offset 0, or a snapshot's tail) cools the idle states it
    # touched once more than this many are hot: a partition restored from its whole history
    # holds about this many objects at most, not every schedule it ever folded
    restore_hot_max: int = 50_000
    # the recurrence engine and tz database named in the ``rules`` header of every event
    # this processor writes (None: the installed ones, ``installed_rules()``)
    rules: RulesVersion | None = None
    # the deployment's routing table for a partition with no routing event of its own yet
    # (docs/design.md §18; None: read at each takeover from the log's routing history,
    # ``chronolog.log.routing_history``); later versions come from the partition's own log
    routing: RoutingTable | None = None
    # the wall clock watched for steps (chronolog.processors.clock, docs/design.md §24): a
    # jump of more than this between two readings is held — the processor's time goes on
    # without it — until the wall clock comes back, or for ``clock_step_hold_s`` (None:
    # until a restart), then followed. None: no guard, the clock is taken as it reads (the
    # library's default: a test's clock may jump; ``chronolog processor`` and ``chronolog
    # dev`` set CLOCK_STEP_S and CLOCK_STEP_HOLD_S, env CHRONOLOG_CLOCK_STEP[_HOLD])
    clock_step_s: float | None = None
    clock_step_hold_s: float | None = 300.0


@dataclass
class ProcessorStats:
    commands: int = 0  # commands decided (a worker's offer is not one: ``offers``)
    offers: int = 0  # workers' offers to take work (each idle worker renews its every second)
    events: int = 0
    ticks: int = 0
    transactions: int = 0
    dead_letters: int = 0
    offers_unverified: int = 0  # pool offers whose proof did not verify (nobody seated)
    decide_errors: int = 0  # commands whose decide raised (rejected as invalid)
    tick_errors: int = 0  # timers whose decide raised (the schedule is not re-armed)
    apply_errors: int = 0  # decisions that could not be applied (the partition was rebuilt)
    duplicates: int = 0
    fenced: int = 0
    restored_from_snapshot: int = 0  # takeovers that started from a snapshot
    restored_from_zero: int = 0  # takeovers that folded events from offset 0
    snapshots_rejected: int = 0  # snapshots ignored (damaged, another version, ...)
    forwarded: int = 0  # commands appended to the partition that may hold their key
    moved_out: int = 0  # keys handed over to another partition
    moved_in: int = 0  # keys adopted from another partition
    cooled: int = 0  # schedule states turned cold (held as their sealed bytes)
    warmed: int = 0  # cold states brought back ahead of their wake-up
    started_at: float = field(default_factory=time.monotonic)
