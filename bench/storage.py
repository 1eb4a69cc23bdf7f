"""Benchmark: bytes kept per run, on each log and in the read model.

One ``chronolog processor``, one ``chronolog worker --builtin-jobs`` and one
``chronolog projector`` subprocess per log; this process creates ``--schedules`` schedules
``every 1s`` (job ``noop``), lets them run for ``--seconds``, pauses them, waits for the
projector, and then measures:

* **log, logical**: key + value + header bytes of every record of every topic under the
  prefix, read back through the EventLog port (what a record costs before any storage
  format or compression), per topic;
* **log, on disk**: SQLite: the file's pages in use after a WAL checkpoint; Kafka: the
  ``.log`` segment files of the prefix's topics in the broker's log directories
  (``--kafka-logs``; batches as the producers compressed them: ``CHRONOLOG_KAFKA_COMPRESSION``
  of the processes is what is measured);
* **read model**: ``pg_total_relation_size`` of ``runs`` and ``attempts`` (tables, TOAST and
  indexes, summed over their partitions), and of every table; and apart, the bytes of the
  partitions of ``runs`` and ``attempts`` that hold no row (the days made ahead and back:
  each an index metapage per index and a TOAST index, a fixed cost), with the figure per
  run net of them.

Each divided by the runs that finished (``ResultPublished``). A benchmark, not a test:
figures go to docs/performance.md.

``--warmup SECONDS`` also gives the read model's *steady-state* bytes per run: the bytes of
``runs`` and ``attempts`` at the end minus those after the warm-up, over the runs that
finished in between (the read model's count of succeeded runs at both points). The
database runs with its own autovacuum configuration, as in production, and nothing else
reclaims space: what autovacuum makes reusable in that time is reused by the runs that
follow, which the end-of-run figure (measured before any vacuum can have run) does not see.

    .venv/bin/python bench/storage.py --log sqlite|kafka [--schedules 100] [--seconds 60]
        [--kafka-logs .kafka] [--database-url DSN] [--breakdown] [--warmup SECONDS]

``--breakdown`` also prints (on stderr) the bytes per run of each record kind (a topic and
an event's or command's type) and, per record, of each of its JSON members: where the bytes go;
and of the read model's ``runs`` and ``attempts``: each heap (live and dead tuples), TOAST and
index, and each column's average width.

**Flat storage** (``--retention 2m --samples 6,12``): the processes run with that retention
(the processor prunes every 10 s, a ``chronolog audit`` runs every 30 s as a deployment's
timer would, so that pruning can follow it), and at each sample minute the bytes kept —
log (logical and on disk), read model (every table) and result objects — are measured
while the schedules keep firing; the last sample over the one before is the figure (flat:
within ±15 %). Kafka frees disk by whole segments: the processes roll them every 30 s here
(``CHRONOLOG_KAFKA_SEGMENT``).

Kafka needs ``KAFKA_BOOTSTRAP_SERVERS``; the read model ``CHRONOLOG_TEST_DATABASE_URL`` (or
``--database-url``): a fresh database is created in it. Run it through
scripts/with_services.py, which starts both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.log.kafka_config import PRUNED_SEGMENT_MS
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, interval_from_env, open_log

sys.path.insert(0, str(Path(__file__).parent))
from e2e import CHRONOLOG, spawn, stop, url_of


def _field_bytes(name: str, value: Any) -> int:
    """The bytes one JSON member ``"name":value,`` takes."""
    return len(orjson.dumps({name: value})) - 1


def tally(into: dict[str, dict[str, Any]], topic: str, key: bytes, value: bytes,
          headers: int) -> None:
    """Add one record to the breakdown: its bytes under its topic and kind (an event's or a
    command's type, in either event format; else the topic), and the bytes of each of its
    JSON members (an envelope's payload member by member), the record key and headers
    included."""
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        raw = None
    kind = topic
    if isinstance(raw, dict):  # an envelope's type, or a compact event's payload's
        inner = raw.get("p")
        kind = str(raw.get("type") or (inner.get("type") if isinstance(inner, dict) else None)
                   or topic)
    row = into.setdefault(f"{topic} {kind}", {"records": 0, "bytes": 0, "fields": {},
                                              "sample": None})
    if raw is not None and row["sample"] is None:
        row["sample"] = [topic, key.decode("utf-8", "replace"), value.decode()]
    row["records"] += 1
    row["bytes"] += len(key) + len(value) + headers
    fields = row["fields"]
    fields["(record key)"] = fields.get("(record key)", 0) + len(key)
    fields["(headers)"] = fields.get("(headers)", 0) + headers
    if not isinstance(raw, dict):
        return
    for name, member in raw.items():
        if name in ("payload", "p") and isinstance(member, dict):
            fields["(payload braces)"] = fields.get("(payload braces)", 0) + 2
            for inner, v in member.items():
                label = f"{name}.{inner}"
                fields[label] = fields.get(label, 0) + _field_bytes(inner, v)
            fields[name] = fields.get(name, 0) + len(name) + 3
        else:
            fields[name] = fields.get(name, 0) + _field_bytes(name, member)


def print_breakdown(into: dict[str, dict[str, Any]], runs: int) -> None:
    """Bytes per run by record kind, and each kind's members, largest first."""
    per = max(runs, 1)
    for kind, row in sorted(into.items(), key=lambda kv: -kv[1]["bytes"]):
        print(f"{row['bytes'] / per:8.0f} B/run {row['records'] / per:5.2f} rec/run "
              f"{row['bytes'] / row['records']:6.0f} B/rec  {kind}", file=sys.stderr)
        for name, n in sorted(row["fields"].items(), key=lambda kv: -kv[1]):
            if n:
                print(f"{'':10}{n / row['records']:7.1f} B/rec  {name}", file=sys.stderr)


async def logical_bytes(lg: Any, breakdown: dict[str, dict[str, Any]] | None = None,
                        ) -> tuple[dict[str, int], int]:
    """Bytes per topic (key + value + headers) and the runs finished (results on events);
    ``breakdown`` (if given) gets each record's bytes by kind and member (``tally``)."""
    sizes: dict[str, int] = {}
    results = 0
    for topic, partitions in (await lg.prefixed_topics()).items():
        total = 0
        for p in range(partitions):
            end = await lg.end_offset(topic, p)
            off = 0
            while off < end:
                recs = await lg.read(topic, p, off, 5000)
                if not recs:
                    break
                for r in recs:
                    headers = sum(len(k) + len(v) for k, v in r.headers)
                    total += len(r.key or b"") + len(r.value) + headers
                    if breakdown is not None:
                        tally(breakdown, topic.removeprefix(lg.topics.prefix), r.key or b"",
                              r.value, headers)
                    if topic == lg.topics.events and b'"ResultPublished"' in r.value:
                        results += codec.decode_event(r.value).type == "ResultPublished"
                off = recs[-1].offset + 1
        sizes[topic.removeprefix(lg.topics.prefix)] = total
    return sizes, results


def sqlite_on_disk(path: Path) -> int:
    conn = sqlite3.connect(str(path))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)
    finally:
        conn.close()


def kafka_on_disk(logs: Path, prefix: str) -> dict[str, int]:
    """Bytes of the ``.log`` segment files of the prefix's topics, per topic."""
    out: dict[str, int] = {}
    for seg in logs.rglob("*.log"):
        folder = seg.parent.name  # <topic>-<partition>
        topic = folder.rsplit("-", 1)[0]
        if topic.startswith(prefix):
            name = topic.removeprefix(prefix)
            out[name] = out.get(name, 0) + seg.stat().st_size
    return out


# every table of the schema with the bytes of its whole partition tree (a partitioned
# table's own size is 0: its rows are in its partitions, counted under its root)
_TABLE_BYTES = """
SELECT COALESCE(root.relname, c.relname) AS relname, sum(pg_total_relation_size(c.oid)) AS size
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_class root ON root.oid = pg_partition_root(c.oid) AND root.oid <> c.oid
 WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema()
 GROUP BY 1
"""

# each index of runs and attempts, summed over the partitions (by the parent index's name)
_INDEX_BYTES = """
SELECT COALESCE(root.relname, i.relname) AS index, sum(pg_relation_size(i.oid)) AS size
  FROM pg_class i JOIN pg_index x ON x.indexrelid = i.oid
  JOIN pg_class t ON t.oid = x.indrelid
  LEFT JOIN pg_class root ON root.oid = pg_partition_root(i.oid) AND root.oid <> i.oid
 WHERE COALESCE(pg_partition_root(t.oid), t.oid) IN ('runs'::regclass, 'attempts'::regclass)
 GROUP BY 1 ORDER BY 2 DESC
"""


async def read_model_bytes(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(_TABLE_BYTES)
        return {r["relname"]: int(r["size"]) for r in rows}
    finally:
        await conn.close()


async def empty_partitions_bytes(dsn: str) -> int:
    """The bytes of the partitions of ``runs`` and ``attempts`` that hold no row: the days
    made ahead of and behind today (the window's, 30 by default), each with its indexes'
    metapages and TOAST index — a fixed cost, not one per run."""
    conn = await asyncpg.connect(dsn)
    try:
        total = 0
        for table in ("runs", "attempts"):
            for r in await conn.fetch(
                    "SELECT relid::regclass::text AS name, pg_total_relation_size(relid) AS size "
                    "FROM pg_partition_tree($1::regclass) WHERE isleaf", table):
                if not await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {r['name']})"):
                    total += int(r["size"])
        return total
    finally:
        await conn.close()


async def print_read_model(dsn: str, runs: int) -> None:
    """Where the read model's bytes of ``runs`` and ``attempts`` go, per run: each table's
    heap (with its live and dead tuples), TOAST and each index; each column's average
    width (``pg_stats`` after an ANALYZE, which changes no size)."""
    per = max(runs, 1)
    conn = await asyncpg.connect(dsn)
    try:
        for table in ("runs", "attempts"):
            r = await conn.fetchrow(
                "SELECT sum(pg_relation_size(t.relid)) AS heap, "
                "sum(pg_total_relation_size(t.relid) - pg_indexes_size(t.relid) "
                "    - pg_relation_size(t.relid)) AS toast, "
                "sum(s.n_live_tup) AS live, sum(s.n_dead_tup) AS dead, "
                "sum(s.n_tup_upd)::bigint AS upd, sum(s.n_tup_hot_upd)::bigint AS hot "
                "FROM pg_partition_tree($1::regclass) t "
                "JOIN pg_stat_user_tables s ON s.relid = t.relid WHERE t.isleaf", table)
            print(f"read model {table}: heap {int(r['heap'] or 0) / per:7.1f} B/run, "
                  f"TOAST {int(r['toast'] or 0) / per:5.1f} B/run, "
                  f"live tuples {r['live']}, dead tuples {r['dead']}, "
                  f"updates {r['upd']} ({r['hot']} HOT)", file=sys.stderr)
        for r in await conn.fetch(_INDEX_BYTES):
            print(f"read model index {r['index']}: {int(r['size']) / per:7.1f} B/run",
                  file=sys.stderr)
        await conn.execute("ANALYZE runs; ANALYZE attempts")
        for r in await conn.fetch(
                "SELECT tablename, attname, avg_width, null_frac FROM pg_stats "
                "WHERE schemaname = current_schema() AND tablename IN ('runs', 'attempts') "
                "AND inherited ORDER BY 1, 3 DESC"):
            print(f"read model column {r['tablename']}.{r['attname']}: "
                  f"avg width {r['avg_width']} B, null {r['null_frac']:.2f}", file=sys.stderr)
    finally:
        await conn.close()


async def projected(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED'") or 0)
    finally:
        await conn.close()


async def fresh_database(url: str) -> str:
    name = f"bench_storage_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


async def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    topics = Topics(prefix=f"st{uuid.uuid4().hex[:6]}.", partitions=args.partitions)
    if args.log == "sqlite":
        cfg = LogConfig("sqlite", str(workdir / "log.db"), topics)
    else:
        # the topics this process creates roll segments as the processes' would
        segment = interval_from_env("CHRONOLOG_KAFKA_SEGMENT", PRUNED_SEGMENT_MS / 1000)
        cfg = LogConfig("kafka", os.environ["KAFKA_BOOTSTRAP_SERVERS"], topics,
                        segment_ms=int(segment * 1000))
    dsn = await fresh_database(args.database_url)
    lg = open_log(cfg)
    await lg.start()
    await lg.ensure_topics()
    common = ["--log", url_of(cfg), "--topic-prefix", topics.prefix,
              "--partitions", str(topics.partitions)]
    kept = ["--retention", args.retention] if args.retention else []
    procs = [spawn(["processor", *common, *kept], workdir / "processor.log"),
             spawn(["worker", *common, "--builtin-jobs", "--concurrency", "64",
                    "--results", str(workdir / "results")], workdir / "worker.log"),
             spawn(["projector", *common, *kept, "--database-url", dsn],
                   workdir / "projector.log")]
    client = Client(lg, reply_timeout=60)
    await client.start()
    ids = [f"s-{i:04d}" for i in range(args.schedules)]
    samples: list[dict[str, Any]] = []
    warm: tuple[int, int] | None = None  # (bytes of runs and attempts, runs) after --warmup
    auditing = None
    try:
        await asyncio.gather(*(client.create_schedule(
            "bench", sid, {"every": "1s", "job": {"type": "noop"}}) for sid in ids))
        if args.samples:
            auditing = asyncio.create_task(audits(cfg, workdir))
            began = asyncio.get_running_loop().time()
            for minute in args.samples:
                await asyncio.sleep(max(0.0, began + minute * 60
                                        - asyncio.get_running_loop().time()))
                samples.append(await kept_now(args, cfg, lg, dsn, workdir, minute))
                print(json.dumps(samples[-1]), flush=True)
        elif args.warmup:
            await asyncio.sleep(args.warmup)
            warm = (await runs_attempts_bytes(dsn), await projected(dsn))
            await asyncio.sleep(max(0.0, args.seconds - args.warmup))
        else:
            await asyncio.sleep(args.seconds)
        await asyncio.gather(*(client.pause("bench", sid) for sid in ids))
        await asyncio.sleep(3)  # the last runs finish
        breakdown: dict[str, dict[str, Any]] | None = {} if args.breakdown else None
        logical, runs = await logical_bytes(lg, breakdown)
        if breakdown is not None:
            print_breakdown(breakdown, runs)
            if args.keep_records:
                Path(args.keep_records).write_text("".join(
                    json.dumps(row["sample"]) + "\n" for _, row in sorted(breakdown.items())
                    if row["sample"]))
        for _ in range(120):  # the projector catches up
            if await projected(dsn) >= runs:
                break
            await asyncio.sleep(1)
    finally:
        if auditing is not None:
            auditing.cancel()
            with contextlib.suppress(BaseException):
                await auditing
        await client.close()
        stop(procs)
        await lg.close()
    if samples:
        return {"log": args.log, "schedules": args.schedules, "retention": args.retention,
                "samples": samples, "last_over_previous": {
                    k: round(samples[-1][k] / samples[-2][k], 3) if len(samples) > 1
                    and samples[-2][k] else None
                    for k in ("log_logical", "log_on_disk", "read_model", "results", "total")}}
    disk = (sqlite_on_disk(Path(cfg.target)) if args.log == "sqlite"
            else sum(kafka_on_disk(Path(args.kafka_logs), topics.prefix).values()))
    model = await read_model_bytes(dsn)
    empty = await empty_partitions_bytes(dsn)
    if args.breakdown:
        await print_read_model(dsn, runs)
    per = (lambda n: round(n / runs)) if runs else (lambda n: 0)
    steady = {}
    if warm is not None:
        grown = model.get("runs", 0) + model.get("attempts", 0) - warm[0]
        since = await projected(dsn) - warm[1]
        steady = {"read_model_runs_attempts_per_run_steady":
                  round(grown / since) if since > 0 else None,
                  "warmup_seconds": args.warmup, "runs_after_warmup": since}
    return {
        "log": args.log, "schedules": args.schedules, "seconds": args.seconds,
        "compression": os.environ.get("CHRONOLOG_KAFKA_COMPRESSION", "-"),
        "runs": runs,
        "log_logical_per_run": per(sum(logical.values())),
        "log_logical_per_run_by_topic": {t: per(n) for t, n in sorted(logical.items())},
        "log_on_disk_per_run": per(disk),
        "read_model_runs_attempts_per_run": per(model.get("runs", 0) + model.get("attempts", 0)),
        "read_model_runs_attempts_empty_partitions": empty,
        "read_model_runs_attempts_per_run_net": per(
            model.get("runs", 0) + model.get("attempts", 0) - empty),
        "read_model_all_per_run": per(sum(model.values())),
        **steady,
    }


async def runs_attempts_bytes(dsn: str) -> int:
    model = await read_model_bytes(dsn)
    return model.get("runs", 0) + model.get("attempts", 0)


async def audits(cfg: LogConfig, workdir: Path) -> None:
    """``chronolog audit`` every 30 s (a deployment's timer): pruning follows its checkpoint.
    A failed audit stops the benchmark: its figures would not be of a pruned log."""
    env = dict(os.environ, CHRONOLOG_TOPIC_PREFIX=cfg.topics.prefix)
    while True:
        await asyncio.sleep(30)
        with open(workdir / "audit.log", "ab") as out:
            child = await asyncio.create_subprocess_exec(
                CHRONOLOG, "audit", "--log", url_of(cfg), stdout=out, stderr=out, env=env)
            if await child.wait() != 0:
                raise SystemExit(f"the audit failed: {(workdir / 'audit.log').read_text()}")


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


async def kept_now(args: argparse.Namespace, cfg: LogConfig, lg: Any, dsn: str,
                   workdir: Path, minute: float) -> dict[str, Any]:
    """What is kept now: log (records held, and on disk), read model, result objects."""
    logical, _ = await logical_bytes(lg)
    disk = (sqlite_on_disk(Path(cfg.target)) if args.log == "sqlite"
            else sum(kafka_on_disk(Path(args.kafka_logs), cfg.topics.prefix).values()))
    model = sum((await read_model_bytes(dsn)).values())
    results = tree_bytes(workdir / "results")
    t = lg.topics.events
    held = [await lg.end_offset(t, p) - await lg.start_offset(t, p)
            for p in range(cfg.topics.partitions)]
    return {"minute": minute, "log_logical": sum(logical.values()), "log_on_disk": disk,
            "read_model": model, "results": results, "total": disk + model + results,
            "events_held": sum(held), "by_topic": logical}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", choices=["sqlite", "kafka"], required=True)
    ap.add_argument("--schedules", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--kafka-logs", default=".kafka", help="the broker's log directories")
    ap.add_argument("--breakdown", action="store_true",
                    help="also print bytes per run by record kind and member (stderr)")
    ap.add_argument("--keep-records", help="with --breakdown: write one record of each kind "
                    "([topic, key, value] JSON lines) to this file")
    ap.add_argument("--database-url", default=os.environ.get("CHRONOLOG_TEST_DATABASE_URL"))
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds: also the steady-state figure, the growth of runs and "
                         "attempts after the warm-up over the runs finished after it")
    ap.add_argument("--retention", default=None, help="e.g. 2m: the processes' retention")
    ap.add_argument("--samples", default="", help="minutes at which to measure, e.g. 6,12")
    args = ap.parse_args()
    args.samples = [float(x) for x in args.samples.split(",") if x]
    if args.samples:
        os.environ.setdefault("CHRONOLOG_PRUNE_EVERY", "10s")
        os.environ.setdefault("CHRONOLOG_KAFKA_SEGMENT", "30s")
    if not args.database_url:
        ap.error("--database-url or CHRONOLOG_TEST_DATABASE_URL is needed")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        print(json.dumps(await bench(args, Path(tmp)), indent=1))


if __name__ == "__main__":
    asyncio.run(main())
