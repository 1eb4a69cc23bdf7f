"""The PostgreSQL side of the projector: row changes, batched writes, offsets in one transaction.

``RowChanges`` is what the pure projection (``project.py``) returns for one event, and what a
batch of events folds into: per table, a dict from primary key to the columns that change.
Folding merges a later change into an earlier one column by column, so a batch of 1000
events touching one run becomes one row write. A column value is either a plain value
(overwrite, ``None`` included: it sets SQL NULL) or ``First(value)`` (set only while the
stored value is NULL: "first writer wins", e.g. a run's first start). A column absent from a
change is never touched — that is the merge rule that keeps a ``ResultPublished`` from wiping
the columns its run row got from ``OccurrenceMaterialized``.

``PostgresProjectionStore.apply(changes, offsets)`` writes a batch in ONE transaction:

1. compare-and-set of each consumed partition's ``next_offset`` (the expected one must be the
   stored one, a missing row counting as 0), which also row-locks those offsets; any
   mismatch raises ``OffsetConflict`` and rolls the whole transaction back (another projector
   or a replay raced us); ``handed_over`` (the move barrier) is raised with it;
2. per table, the rows grouped by their *column signature* (which columns, and which of them
   are ``First``); one statement per group, whatever the number of rows:
   * a group that sets every required column of the table (NOT NULL, no default: what the
     row's creating event sets) is an ``INSERT ... SELECT FROM unnest($1::text[], ...)
     ON CONFLICT (key) DO UPDATE SET`` *only those columns*;
   * any other group is an ``UPDATE ... FROM unnest(...)`` of existing rows. (An INSERT of a
     partial row would fail PostgreSQL's NOT NULL check even when the row exists.) Rows it
     does not find are reported in ``ApplyResult.missing`` rather than invented.

3. the run counters (``Tally``, docs/deployment.md, "Metrics"): the outcomes, skips and
   first-claim lateness the batch's events record are added to ``run_counters`` and the
   READY runs are kept in ``ready_runs`` (with their count per resource class and job type),
   in the same transaction — so ``/metrics`` reads a few rows and never scans ``runs``; so
   are the open attempts and their lease ends in ``open_attempts`` (the expired leases of
   ``/metrics``). A tally's labels are its run's resource class and job type (fixed when the
   run is materialized) and, for an instant that never became a run, its schedule's at that
   point of the log: from the batch when an earlier event of it set the spec, else from
   ``schedules`` before the batch is written. A replay therefore adds up to the same
   counters whatever its batches.

jsonb values are encoded with orjson and sent as ``text[]``; timestamps must be aware datetimes.

PostgreSQL's text and jsonb cannot hold the character U+0000, which the log can: the store
writes it as U+FFFD (the replacement character) in text columns and in every string of a
jsonb value, keys included; the log keeps the original. Any other value the database refuses
(``refused_for_its_data``) fails the transaction, and the projector finds the record at fault.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import asyncpg
import orjson
import structlog

from chronolog.projections.migrate import migrate as _migrate
from chronolog.wakeup import wait_within

log = structlog.get_logger("chronolog.projections.store")

CLOSE_TIMEOUT_S = 30.0  # close(): the longest wait for the pool's connections

__all__ = [
    "LATENESS_BUCKETS",
    "OUTCOMES",
    "TABLES",
    "ApplyResult",
    "First",
    "OffsetConflict",
    "PostgresProjectionStore",
    "RowChanges",
    "TableSpec",
    "Tally",
    "bucket_label",
    "refused_for_its_data",
]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class First:
    """A column value that is written only if the stored value is NULL (first writer wins)."""

    value: Any


@dataclass(frozen=True)
class TableSpec:
    """A read-model table as the store writes it (must agree with the migrations)."""

    name: str
    key: tuple[str, ...]
    types: Mapping[str, str]  # every writable column, key included -> PostgreSQL type
    required: frozenset[str]  # non-key columns that are NOT NULL without a default
    # a partitioned table (migration 0009): its partition column, which its unique key
    # holds beside ``key`` and which a write never changes once the row exists
    partition: str | None = None
    # columns the store fills in SQL on insert, not the projection: column -> expression
    # over the batch's row ``u`` (NOT NULL without a default, like ``required``)
    derived: Mapping[str, str] = field(default_factory=dict)

    # The writable non-key columns; computed once (RowChanges.set checks every change
    # against it, so a property recomputing it was a measurable part of projecting).
    columns: frozenset[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", frozenset(self.types) - frozenset(self.key))


def _spec(name: str, key: tuple[str, ...], required: Iterable[str], /, *,
          partition: str | None = None, derived: Mapping[str, str] | None = None,
          **types: str) -> TableSpec:
    spec = TableSpec(name, key, MappingProxyType(types), frozenset(required), partition,
                     MappingProxyType(dict(derived or {})))
    assert set(key) <= set(types) and spec.required <= spec.columns, name
    return spec


TS, TEXT, BIGINT, INT, BOOL, JSONB = "timestamptz", "text", "bigint", "integer", "boolean", "jsonb"

TABLES: Mapping[str, TableSpec] = MappingProxyType(
    {
        "schedules": _spec(
            "schedules",
            ("tenant", "schedule_id"),
            ("revision", "state", "spec", "created_at", "updated_at", "last_event_at"),
            tenant=TEXT, schedule_id=TEXT, revision=BIGINT, state=TEXT, spec=JSONB,
            request_key=TEXT, anchor=TS, fence=BIGINT, next_run_at=TS, next_due_at=TS,
            paused_at=TS, pause_reason=TEXT, deleted_at=TS, created_at=TS, updated_at=TS,
            last_event_at=TS, completed_at=TS, completed_reason=TEXT,
        ),
        "runs": _spec(
            "runs",
            ("run_id",),
            ("tenant", "schedule_id", "scheduled_at", "revision", "trigger", "state", "updated_at"),
            partition="scheduled_at",
            run_id=TEXT, tenant=TEXT, schedule_id=TEXT, scheduled_at=TS, due_at=TS,
            revision=BIGINT, trigger=TEXT, request_key=TEXT, state=TEXT, attempt=INT,
            job_type=TEXT, params=JSONB, resource_class=TEXT, priority=INT, sequence=BIGINT,
            start_deadline_at=TS, ready_at=TS, retry_at=TS, started_at=TS,
            finished_at=TS, result_checksum=TEXT, result_size=BIGINT, result_uri=TEXT,
            result_inline=JSONB, result_attempt=INT, skipped_reason=TEXT, skipped_through=TS,
            skipped_count=INT, cancellation_requested=BOOL, cancel_reason=TEXT,
            dead_reason=TEXT, dead_message=TEXT, last_error_class=TEXT, last_error=TEXT,
            reconciliation=JSONB, reconciliation_resolution=JSONB, updated_at=TS,
            first_fence=BIGINT, first_worker_id=TEXT, first_lease_until=TS, first_outcome=TEXT,
            first_error_class=TEXT, first_error=TEXT, first_finished_at=TS,
            permit_wait=JSONB, exclusion=JSONB,
        ),
        "attempts": _spec(
            "attempts",
            ("run_id", "attempt"),
            ("fence", "worker_id", "claimed_at", "lease_until"),
            partition="scheduled_at",
            # the run's scheduled_at: the run's row is written before its attempts (TABLES
            # order); an attempt whose run has no row (pruned) takes its claimed_at
            derived={"scheduled_at": 'COALESCE((SELECT r.scheduled_at FROM runs AS r '
                                     'WHERE r.run_id = u.run_id LIMIT 1), u.claimed_at)'},
            run_id=TEXT, attempt=INT, fence=BIGINT, worker_id=TEXT, claimed_at=TS,
            lease_until=TS, outcome=TEXT, error_class=TEXT, error=TEXT, finished_at=TS,
        ),
        "calendars": _spec(
            "calendars",
            ("tenant", "name"),
            ("revision", "updated_at"),
            tenant=TEXT, name=TEXT, revision=BIGINT, spec=JSONB, created_at=TS, deleted_at=TS,
            updated_at=TS,
        ),
        "effects": _spec(
            "effects",
            ("effect_id",),
            ("tenant", "schedule_id", "run_id", "kind", "state", "created_at", "updated_at"),
            effect_id=TEXT, tenant=TEXT, schedule_id=TEXT, run_id=TEXT, kind=TEXT, state=TEXT,
            attempts=INT, checksum=TEXT, config=JSONB, evidence=JSONB, created_at=TS,
            updated_at=TS,
        ),
    }
)

Row = dict[str, Any]

# ------------------------------------------------------------------ run counters

# the start-lateness histogram's buckets (upper bounds, seconds): 5 ms to 1 h
LATENESS_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)
_BUCKET_US = tuple(round(b * 1_000_000) for b in LATENESS_BUCKETS)
OUTCOMES = ("succeeded", "dead", "cancelled", "skipped")
_US = timedelta(microseconds=1)


def bucket_label(bound: float) -> str:
    """The ``le`` label of a bucket (as ``run_counters.label`` stores it)."""
    return repr(float(bound))


def _bucket_of(us: int) -> str:
    """The label of the bucket a lateness of ``us`` microseconds falls in (``+Inf`` past 1 h)."""
    i = bisect_left(_BUCKET_US, us)
    return bucket_label(LATENESS_BUCKETS[i]) if i < len(_BUCKET_US) else "+Inf"


# Tally kinds counted as they are, by (tenant, resource class, job type, label):
# ``lease_expired`` (LeaseExpired), ``rejected`` (CompletionRejected; label: its reason),
# ``effect`` (EffectSucceeded / EffectUncertain / EffectFailed; label: the outcome)
EVENT_COUNTERS = ("lease_expired", "rejected", "effect")


@dataclass(slots=True)
class Tally:
    """One addition to the run counters, recorded by the projection of one event.

    ``kind``: ``finished`` (``label``: the outcome, ``OUTCOMES`` but ``skipped``),
    ``skipped`` (``label``: the reason; ``n``: the instants it stands for; also an outcome
    ``skipped``), one of ``EVENT_COUNTERS``, or ``lateness`` (a run's first claim at
    ``claimed_at``; the store measures it from the run's due time). ``never_run``: an
    instant that never became a run, labelled with its schedule's resource class and job
    type (``spec`` once known)."""

    kind: str
    tenant: str
    schedule_id: str
    run_id: str
    label: str = ""
    n: int = 1
    claimed_at: datetime | None = None
    never_run: bool = False
    spec: tuple[str, str] | None = None


def _spec_labels(schedule_row: Row | None) -> tuple[str, str] | None:
    """(resource class, job type) of a schedule's spec in a row change, if it sets one."""
    if not schedule_row or "spec" not in schedule_row:
        return None
    spec = schedule_row["spec"] or {}
    return (str(spec.get("resource_class") or "default"),
            str((spec.get("job") or {}).get("type") or ""))


def _merge_value(old: Any, new: Any) -> Any:
    """The value of a column after ``old`` then ``new`` were applied in that order."""
    if not isinstance(new, First):
        return new
    if isinstance(old, First):
        return old if old.value is not None else new
    return new.value if old is None else old


@dataclass
class RowChanges:
    """Per-table changes keyed by primary key (a tuple, in ``TableSpec.key`` order).

    Build with ``set``; fold a later change into an earlier one with ``merge``. Each row
    dict holds only the columns that change (key columns excluded).
    """

    schedules: dict[tuple[Any, ...], Row] = field(default_factory=dict)
    runs: dict[tuple[Any, ...], Row] = field(default_factory=dict)
    attempts: dict[tuple[Any, ...], Row] = field(default_factory=dict)
    effects: dict[tuple[Any, ...], Row] = field(default_factory=dict)
    calendars: dict[tuple[Any, ...], Row] = field(default_factory=dict)
    tallies: list[Tally] = field(default_factory=list)  # in log order

    def tally(self, t: Tally) -> RowChanges:
        """Record a counter addition after the changes so far (whose spec labels it)."""
        self._label(t)
        self.tallies.append(t)
        return self

    def _label(self, t: Tally) -> None:
        if t.never_run and t.spec is None:
            t.spec = _spec_labels(self.schedules.get((t.tenant, t.schedule_id)))

    def table(self, name: str) -> dict[tuple[Any, ...], Row]:
        """The changes to table ``name``."""
        if name not in TABLES:
            raise KeyError(f"unknown table {name!r}")
        rows: dict[tuple[Any, ...], Row] = getattr(self, name)
        return rows

    def set(self, table: str, key: tuple[Any, ...], **columns: Any) -> RowChanges:
        """Change ``columns`` of the row ``key`` of ``table`` (merging into earlier changes)."""
        spec = TABLES[table]
        if len(key) != len(spec.key):
            raise ValueError(f"{table}: key {key!r} does not match {spec.key}")
        if not spec.columns.issuperset(columns):
            unknown = columns.keys() - spec.columns
            raise ValueError(f"{table}: unknown or key columns {sorted(unknown)}")
        rows = self.table(table)
        row = rows.get(key)
        if row is None:
            rows[key] = dict(columns)
        else:
            for col, value in columns.items():
                row[col] = _merge_value(row[col], value) if col in row else value
        return self

    def merge(self, later: RowChanges) -> RowChanges:
        """Fold ``later`` (changes that happened after these) into ``self``; returns self."""
        for t in later.tallies:  # labelled by the changes before ``later``'s own
            self._label(t)
        for name in TABLES:
            mine = self.table(name)
            for key, row in later.table(name).items():
                current = mine.get(key)
                if current is None:
                    mine[key] = dict(row)
                else:
                    for col, value in row.items():
                        current[col] = (_merge_value(current[col], value) if col in current
                                        else value)
        self.tallies.extend(later.tallies)
        return self

    @classmethod
    def fold(cls, changes: Iterable[RowChanges]) -> RowChanges:
        """The changes of a batch, in log order, folded into one."""
        out = cls()
        for c in changes:
            out.merge(c)
        return out

    def row_count(self) -> int:
        """How many rows this would write."""
        return sum(len(self.table(name)) for name in TABLES)

    def __bool__(self) -> bool:
        return self.row_count() > 0 or bool(self.tallies)


class OffsetConflict(RuntimeError):
    """A stored offset differed from the expected one; the transaction was rolled back."""

    def __init__(
        self,
        projection: str,
        expected: Mapping[TopicPartition, int],
        actual: Mapping[TopicPartition, int | None],
    ) -> None:
        self.projection = projection
        self.expected = dict(expected)
        self.actual = dict(actual)
        diff = ", ".join(
            f"{t}[{p}] expected {expected[(t, p)]} stored {actual.get((t, p))}"
            for (t, p) in sorted(expected)
            if actual.get((t, p), 0) != expected[(t, p)]
        )
        super().__init__(f"projection {projection!r}: offset conflict: {diff}")


@dataclass
class ApplyResult:
    """What one ``apply`` wrote."""

    rows: dict[str, int] = field(default_factory=dict)  # rows written per table
    statements: int = 0  # row statements executed (offsets and counters excluded)
    counters: int = 0  # run_counters rows added to
    # partial changes whose row did not exist (not written): table -> keys
    missing: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)


def _quote(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


NUL, NUL_STANDIN = "\x00", "\ufffd"

# errors of a transaction refused for the values it writes (not for the connection): SQL
# classes 22 (data exception), 23 (integrity constraint) and 54 (program limit exceeded),
# and the driver's own refusal to encode a value (asyncpg's client-side DataError is a
# ValueError; OverflowError, TypeError)
_DATA_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError, asyncpg.exceptions.IntegrityConstraintViolationError,
    asyncpg.exceptions.ProgramLimitExceededError, ValueError, OverflowError, TypeError,
)


def refused_for_its_data(exc: BaseException) -> bool:
    """Whether the database (or the driver) refused a write because of the values in it."""
    return isinstance(exc, _DATA_ERRORS) and not isinstance(exc, OffsetConflict)


def _without_nul(value: Any) -> Any:
    """``value`` with U+0000 replaced by U+FFFD in every string (dict keys included)."""
    if isinstance(value, str):
        return value.replace(NUL, NUL_STANDIN)
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_nul(v) for v in value]
    return value


def _encode(pg_type: str, value: Any) -> Any:
    if value is None:
        return None
    if pg_type == JSONB:
        text = orjson.dumps(value).decode()
        return orjson.dumps(_without_nul(value)).decode() if "\\u0000" in text else text
    if isinstance(value, str) and NUL in value:
        return value.replace(NUL, NUL_STANDIN)
    return value


class _SqlCache:
    """The SQL text per (table, signature, mode), built once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, tuple[tuple[str, bool], ...], bool], str] = {}

    def get(self, spec: TableSpec, signature: tuple[tuple[str, bool], ...], insert: bool) -> str:
        k = (spec.name, signature, insert)
        sql = self._cache.get(k)
        if sql is None:
            sql = self._cache[k] = self._build(spec, signature, insert)
        return sql

    @staticmethod
    def _build(spec: TableSpec, signature: tuple[tuple[str, bool], ...], insert: bool) -> str:
        cols = [c for c, _ in signature]
        allc = [*spec.key, *cols]
        params = ", ".join(
            f"${i}::{'text' if spec.types[c] == JSONB else spec.types[c]}[]"
            for i, c in enumerate(allc, start=1)
        )
        alias = ", ".join(_quote(c) for c in allc)

        def src(c: str) -> str:
            return f"u.{_quote(c)}" + ("::jsonb" if spec.types[c] == JSONB else "")

        table = _quote(spec.name)
        keys = ", ".join(_quote(k) for k in spec.key)
        sets = ", ".join(
            f"{_quote(c)} = COALESCE(t.{_quote(c)}, {src(c)})" if first
            else f"{_quote(c)} = {src(c)}"
            for c, first in signature if c != spec.partition
        )
        match = " AND ".join(f"t.{_quote(k)} = u.{_quote(k)}" for k in spec.key)
        returning = ", ".join(f"t.{_quote(k)}" for k in spec.key)
        if not insert:
            return (
                f"UPDATE {table} AS t SET {sets} FROM unnest({params}) AS u({alias}) "
                f"WHERE {match} RETURNING {returning}"
            )
        upsert = ", ".join(
            f"{_quote(c)} = COALESCE(t.{_quote(c)}, EXCLUDED.{_quote(c)})"
            if first
            else f"{_quote(c)} = EXCLUDED.{_quote(c)}"
            for c, first in signature if c != spec.partition
        )
        names = [*allc, *spec.derived]
        values = [*(src(c) for c in allc), *spec.derived.values()]
        if spec.partition is None:
            return (
                f"INSERT INTO {table} AS t ({alias}) "
                f"SELECT {', '.join(values)} FROM unnest({params}) AS u({alias}) "
                f"ON CONFLICT ({keys}) DO UPDATE SET {upsert}"
            )
        # A partitioned table's unique key holds its partition column too, so the key alone
        # is made unique here: the rows found by key are updated (their partition column
        # left as it is), and only the keys not found are inserted.
        found = " AND ".join(f"f.{_quote(k)} = u.{_quote(k)}" for k in spec.key)
        return (
            f"WITH u AS (SELECT * FROM unnest({params}) AS u({alias})), "
            f"found AS (UPDATE {table} AS t SET {sets} FROM u WHERE {match} "
            f"RETURNING {returning}) "
            f"INSERT INTO {table} AS t ({', '.join(_quote(c) for c in names)}) "
            f"SELECT {', '.join(values)} FROM u "
            f"WHERE NOT EXISTS (SELECT 1 FROM found AS f WHERE {found}) "
            f"ON CONFLICT ({keys}, {_quote(spec.partition)}) DO UPDATE SET {upsert}"
        )


class PostgresProjectionStore:
    """The projector's PostgreSQL store: migrations, offsets and atomic batched writes."""

    def __init__(self, pool: asyncpg.Pool, projection: str = "main") -> None:
        self.pool = pool
        self.projection = projection
        self._sql = _SqlCache()

    @classmethod
    async def connect(
        cls, dsn: str, projection: str = "main", *, min_size: int = 1, max_size: int = 5
    ) -> PostgresProjectionStore:
        """Open a connection pool on ``dsn`` (a running projector keeps one of its connections
        for its projection lease)."""
        pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size)
        assert pool is not None
        return cls(pool, projection)

    async def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Close the pool: wait up to ``timeout`` for its connections to be released (a
        connection still held then — a stuck query, a task that was never stopped — would
        hold ``close`` for ever), then terminate what is left."""
        try:
            await wait_within(self.pool.close(), timeout)
        except TimeoutError:
            log.warning("read_model_pool_terminated", after_s=timeout)
            self.pool.terminate()

    async def __aenter__(self) -> PostgresProjectionStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def migrate(self) -> list[int]:
        """Apply pending migrations (advisory-locked); return the versions applied now."""
        async with self.pool.acquire() as conn:
            return await _migrate(conn)

    async def offsets(self) -> dict[TopicPartition, int]:
        """The next offset to consume per (topic, partition), as stored for this projection."""
        rows = await self.pool.fetch(
            "SELECT topic, partition, next_offset FROM projection_offsets WHERE projection = $1",
            self.projection,
        )
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

    async def handovers(self, topic: str) -> dict[int, int]:
        """Partition -> the highest routing version whose ``HandedOver`` is applied (the move
        barrier, docs/design.md §9), for every partition of ``topic`` any projector of this
        projection wrote (partitions without a handover are left out)."""
        rows = await self.pool.fetch(
            "SELECT partition, handed_over FROM projection_offsets WHERE projection = $1 "
            "AND topic = $2 AND handed_over > 0", self.projection, topic)
        return {r["partition"]: r["handed_over"] for r in rows}

    async def apply(
        self,
        changes: RowChanges,
        offsets: Mapping[TopicPartition, tuple[int, int]],
        *,
        last_event_at: Mapping[TopicPartition, datetime] | None = None,
        handed_over: Mapping[TopicPartition, int] | None = None,
    ) -> ApplyResult:
        """Write ``changes`` and advance ``offsets`` ({tp: (expected_next, new_next)}) atomically.

        ``handed_over`` ({tp: version}): the highest routing version whose ``HandedOver`` the
        batch applies on that partition (the move barrier: ``handovers()``); a stored higher
        one is kept. Raises ``OffsetConflict`` (nothing written) if a stored offset is not the
        expected one.
        """
        for tp, (expected, new) in offsets.items():
            if expected < 0 or new < expected:
                raise ValueError(f"{tp}: offsets must move forward, got {expected} -> {new}")
        result = ApplyResult()
        async with self.pool.acquire() as conn, conn.transaction():
            if offsets:
                await self._advance_offsets(conn, offsets, last_event_at or {},
                                            handed_over or {})
            specs = await _schedule_labels(conn, changes.tallies)  # before the rows change
            for spec in TABLES.values():
                rows = changes.table(spec.name)
                if rows:
                    await self._write_table(conn, spec, rows, result)
            shard = min((p for _, p in offsets), default=0)
            result.counters = await _count(conn, changes, specs, shard)
            await _keep_open_attempts(conn, changes)
        return result

    async def _advance_offsets(
        self,
        conn: asyncpg.Connection,
        offsets: Mapping[TopicPartition, tuple[int, int]],
        last_event_at: Mapping[TopicPartition, datetime],
        handed_over: Mapping[TopicPartition, int],
    ) -> None:
        tps = sorted(offsets)  # a fixed lock order: concurrent projectors cannot deadlock
        topics = [t for t, _ in tps]
        parts = [p for _, p in tps]
        await conn.execute(
            """
            INSERT INTO projection_offsets (projection, topic, partition, next_offset)
            SELECT $1, u.topic, u.partition, 0
            FROM unnest($2::text[], $3::integer[]) AS u(topic, partition)
            ORDER BY u.topic, u.partition
            ON CONFLICT (projection, topic, partition) DO NOTHING
            """,
            self.projection, topics, parts,
        )
        moved = await conn.fetch(
            """
            UPDATE projection_offsets AS o
               SET next_offset = u.new_offset,
                   last_event_at = COALESCE(u.last_event_at, o.last_event_at),
                   handed_over = GREATEST(o.handed_over, u.handed_over),
                   updated_at = now()
              FROM unnest($2::text[], $3::integer[], $4::bigint[], $5::bigint[], $6::timestamptz[],
                          $7::integer[])
                   AS u(topic, partition, expected, new_offset, last_event_at, handed_over)
             WHERE o.projection = $1 AND o.topic = u.topic AND o.partition = u.partition
               AND o.next_offset = u.expected
            RETURNING o.topic, o.partition
            """,
            self.projection, topics, parts,
            [offsets[tp][0] for tp in tps], [offsets[tp][1] for tp in tps],
            [last_event_at.get(tp) for tp in tps], [handed_over.get(tp, 0) for tp in tps],
        )
        if len(moved) != len(tps):
            rows = await conn.fetch(
                "SELECT topic, partition, next_offset FROM projection_offsets "
                "WHERE projection = $1",
                self.projection,
            )
            actual: dict[TopicPartition, int | None] = {
                (r["topic"], r["partition"]): r["next_offset"] for r in rows
            }
            raise OffsetConflict(
                self.projection, {tp: offsets[tp][0] for tp in tps}, actual
            )  # raised inside the transaction: everything rolls back

    async def _write_table(
        self,
        conn: asyncpg.Connection,
        spec: TableSpec,
        rows: Mapping[tuple[Any, ...], Row],
        result: ApplyResult,
    ) -> None:
        groups: dict[tuple[tuple[str, bool], ...], list[tuple[tuple[Any, ...], Row]]] = {}
        for key, row in rows.items():
            if not row:
                continue
            signature = tuple(sorted((c, isinstance(v, First)) for c, v in row.items()))
            groups.setdefault(signature, []).append((key, row))
        for signature, members in groups.items():
            cols = [c for c, _ in signature]
            insert = spec.required <= set(cols)
            args: list[list[Any]] = [[key[i] for key, _ in members] for i in range(len(spec.key))]
            for c in cols:
                pg_type = spec.types[c]
                column: list[Any] = []
                for _, row in members:
                    v = row[c]
                    column.append(_encode(pg_type, v.value if isinstance(v, First) else v))
                args.append(column)
            sql = self._sql.get(spec, signature, insert)
            if insert:
                await conn.execute(sql, *args)
                written = len(members)
            else:
                found = await conn.fetch(sql, *args)
                written = len(found)
                if written != len(members):
                    have = {tuple(r) for r in found}
                    lost = [key for key, _ in members if tuple(key) not in have]
                    result.missing.setdefault(spec.name, []).extend(lost)
            result.statements += 1
            result.rows[spec.name] = result.rows.get(spec.name, 0) + written


async def _schedule_labels(conn: asyncpg.Connection, tallies: list[Tally]
                           ) -> dict[tuple[str, str], tuple[str, str]]:
    """(resource class, job type) of the stored schedules that tallies of instants that never
    became runs still need (read before the batch changes ``schedules``)."""
    keys = sorted({(t.tenant, t.schedule_id) for t in tallies if t.never_run and t.spec is None})
    if not keys:
        return {}
    rows = await conn.fetch(
        "SELECT s.tenant, s.schedule_id, COALESCE(s.spec->>'resource_class', 'default'), "
        "COALESCE(s.spec->'job'->>'type', '') FROM schedules s "
        "JOIN unnest($1::text[], $2::text[]) AS u(tenant, schedule_id) "
        "ON s.tenant = u.tenant AND s.schedule_id = u.schedule_id",
        [k[0] for k in keys], [k[1] for k in keys])
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, First) else value


async def _keep_open_attempts(conn: asyncpg.Connection, changes: RowChanges) -> None:
    """Keep ``open_attempts`` (migration 0011) for the attempts the batch wrote: an attempt
    with no outcome is there with its lease end, any other is not (so that the publish, which
    sets the outcome, changes no indexed column of ``attempts``). An attempt 1 is columns of
    its run row (migration 0012), a later one a row of ``attempts``."""
    later = [key for key, row in changes.attempts.items()
             if "outcome" in row or "lease_until" in row]
    first = [key[0] for key, row in changes.runs.items()
             if "first_outcome" in row or "first_lease_until" in row]
    if not (later or first):
        return
    run_ids = [k[0] for k in later] + first
    numbers = [k[1] for k in later] + [1] * len(first)
    await conn.execute(
        "DELETE FROM open_attempts o USING unnest($1::text[], $2::integer[]) AS u(r, a) "
        "WHERE o.run_id = u.r AND o.attempt = u.a", run_ids, numbers)
    if later:
        await conn.execute(
            "INSERT INTO open_attempts (run_id, attempt, lease_until) "
            "SELECT t.run_id, t.attempt, t.lease_until FROM attempts AS t "
            "JOIN unnest($1::text[], $2::integer[]) AS u(r, a) "
            "ON t.run_id = u.r AND t.attempt = u.a "
            "WHERE t.outcome IS NULL AND t.lease_until IS NOT NULL",
            [k[0] for k in later], [k[1] for k in later])
    if first:
        await conn.execute(
            "INSERT INTO open_attempts (run_id, attempt, lease_until) "
            "SELECT t.run_id, 1, t.first_lease_until FROM runs AS t "
            "WHERE t.run_id = ANY($1::text[]) "
            "AND t.first_outcome IS NULL AND t.first_lease_until IS NOT NULL", first)


async def _count(conn: asyncpg.Connection, changes: RowChanges,
                 specs: Mapping[tuple[str, str], tuple[str, str]], shard: int) -> int:
    """Add the batch's tallies and READY moves to ``run_counters`` (after its rows are
    written); the number of counter rows added to."""
    # (metric, tenant, resource class, job type, label) -> amount
    deltas: Counter[tuple[str, str, str, str, str]] = Counter()
    moved = [key[0] for key, row in changes.runs.items() if "state" in row]
    if moved:  # a run whose state changed left READY, or is READY (again)
        for r in await conn.fetch(
                "DELETE FROM ready_runs WHERE run_id = ANY($1::text[]) "
                "RETURNING resource_class, job_type", moved):
            deltas["ready", "", r[0], r[1], ""] -= 1
        for r in await conn.fetch(
                "INSERT INTO ready_runs (run_id, resource_class, job_type, ready_at) "
                "SELECT run_id, COALESCE(resource_class, 'default'), COALESCE(job_type, ''), "
                "COALESCE(ready_at, updated_at) FROM runs "
                "WHERE run_id = ANY($1::text[]) AND state = 'READY' "
                "RETURNING resource_class, job_type", moved):
            deltas["ready", "", r[0], r[1], ""] += 1
    if changes.tallies:
        runs = await _run_labels(conn, changes)
        for t in changes.tallies:
            if t.never_run:
                rc, job = t.spec or specs.get((t.tenant, t.schedule_id), ("default", ""))
                due = None
            else:
                rc, job, due = runs.get(t.run_id, ("default", "", None))
            if t.kind == "lateness":
                if due is None or t.claimed_at is None:
                    continue  # a claim of a run the read model does not have
                us = (t.claimed_at - due) // _US
                deltas["lateness", t.tenant, rc, "", _bucket_of(us)] += 1
                deltas["lateness_sum", t.tenant, rc, "", ""] += us
            elif t.kind == "skipped":
                deltas["finished", t.tenant, rc, job, "skipped"] += t.n
                deltas["skipped", t.tenant, rc, job, t.label] += t.n
            elif t.kind in EVENT_COUNTERS:
                deltas[t.kind, t.tenant, rc, job, t.label] += t.n
            else:
                deltas["finished", t.tenant, rc, job, t.label] += t.n
    keys = sorted(k for k, v in deltas.items() if v)  # a fixed lock order
    if keys:
        await conn.execute(
            "INSERT INTO run_counters AS t "
            "(shard, metric, tenant, resource_class, job_type, label, value) "
            "SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], "
            "$6::text[], $7::bigint[]) ON CONFLICT "
            "(shard, metric, tenant, resource_class, job_type, label) "
            "DO UPDATE SET value = t.value + EXCLUDED.value",
            shard, *([k[i] for k in keys] for i in range(5)), [deltas[k] for k in keys])
    return len(keys)


async def _run_labels(conn: asyncpg.Connection, changes: RowChanges
                      ) -> dict[str, tuple[str, str, datetime | None]]:
    """(resource class, job type, due time) of the runs the tallies name: from the batch when
    it materialized them, else from ``runs`` (these columns never change after that)."""
    out: dict[str, tuple[str, str, datetime | None]] = {}
    lookup = []
    for rid in {t.run_id for t in changes.tallies if not t.never_run}:
        row = changes.runs.get((rid,))
        if row is not None and "job_type" in row and "scheduled_at" in row:
            out[rid] = (_plain(row.get("resource_class")) or "default",
                        _plain(row["job_type"]) or "",
                        _plain(row.get("due_at")) or _plain(row["scheduled_at"]))
        else:
            lookup.append(rid)
    if lookup:
        for r in await conn.fetch(
                "SELECT run_id, COALESCE(resource_class, 'default'), COALESCE(job_type, ''), "
                "COALESCE(due_at, scheduled_at) FROM runs WHERE run_id = ANY($1::text[])",
                sorted(lookup)):
            out[r[0]] = (r[1], r[2], r[3])
    return out
