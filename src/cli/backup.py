"""``chronolog backup DIR`` / ``chronolog restore DIR``: the whole deployment's data — the
log, the read model and the result store — into a directory, and back into an empty
deployment.

    chronolog backup DIR  [--data-dir D | --log URL] [--database-url DSN] [--results R]
    chronolog backup verify DIR [--accept-unverified]
    chronolog restore DIR [--data-dir D | --log URL] [--database-url DSN] [--results R]
                          [--accept-unverified]

``--data-dir D`` alone names a dev node's data: ``D/log.db``, the embedded PostgreSQL in
``D/postgres`` and ``D/results``; ``--log kafka://host:port`` a Kafka log (the topics under
``CHRONOLOG_TOPIC_PREFIX``). A backup may be taken while the deployment runs. It is
taken in the order that keeps the parts consistent: the read model first (one REPEATABLE
READ snapshot of every table, binary COPY), then the log (SQLite: the online backup API,
every topic with its offsets, consumer-group offsets and owner epochs; Kafka: every
committed record of every topic but ``state``, with partition, offset, key, headers and
timestamp, and the committed offsets of every group under the prefix), then the result store
(staged objects are immutable files, written before the events that name them). So the
restored read model is never ahead of the restored log (the projector carries on from its
offsets), and every result the log names is there. ``DIR/manifest.json`` is written last,
with every file's size and SHA-256 (``chronolog.cli.backup_check``): a directory without it
is an incomplete backup.

``backup verify DIR`` checks a backup without restoring it, as ``restore`` does first: exit 0
and one summary line, or exit 2 and one line naming the first problem.

``restore`` verifies the whole backup, then writes it into an empty deployment — no log
records, no read-model rows, no result objects — and refuses anything else (exit 2, naming
the damaged file or what is not empty) before writing anything. It stages every part beside
the target and makes them visible only when all are staged (the restore section below).
Everything a decision needs survives: the events (outbox intents of
effects, request keys of manual triggers, fences), the processors' and the effect
runners' committed offsets. Started on the restored data, a processor answers a repeated
trigger with its original run, and the effect runner performs an effect that had not been
performed yet — once.

A Kafka restore appends the records into empty topics under the target prefix (which may
differ from the backup's) without transactions, so their offsets are renumbered densely;
the read model's projection offsets and the groups' committed offsets are translated to
the new numbering (an old next offset becomes the new offset of the first record at or
after it).

Exit status: 0 done; 2 bad input (a damaged backup: a file missing, unlisted, of another
size or checksum, a log failing its integrity check, a count that differs; a non-empty target
or backup directory; a missing or invalid manifest; a read model of other migrations; a
backup of the other log kind) with one line on stderr; 1 with one line for a failure while
restoring (a database or disk error; run the same restore again).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import dataclasses
import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from chronolog.cli.backup_check import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    Verified,
    file_entries,
    manifest_checksum,
    verify,
)
from chronolog.cli.errors import UsageError
from chronolog.cli.flags import database, existing_database
from chronolog.cli.log_reader import add_log_arguments, log_config, open_existing_log
from chronolog.environment import utc_now
from chronolog.files import fsync_directory, write_atomically
from chronolog.log.port import LogError, OutRecord
from chronolog.log.reading import read_partition
from chronolog.log.sqlite import backup_file, forget_members, record_counts, restore_file
from chronolog.projections.backup import (
    BackupMismatch,
    drop_stages,
    dump,
    emptiness,
    renumber_offsets,
    stage,
)
from chronolog.projections.lease import LeaseHeld, ProjectionLease, current_schema
from chronolog.projections.migrate import MigrationError
from chronolog.projections.rebuild import SwapBusy, drop_schema, quote, swap_in
from chronolog.settings import LogConfig, data_dir, open_log


def register(subparsers: Any) -> None:
    """Add ``backup`` and ``restore`` to the ``chronolog`` parser."""
    b = subparsers.add_parser(
        "backup", help="copy the log, the read model and the result store into DIR",
        description="Back up a deployment (it may be running): the read model, then the log, "
                    "then the result store, then DIR/manifest.json.")
    r = subparsers.add_parser(
        "restore", help="restore a backup into an empty deployment",
        description="Restore DIR (a 'chronolog backup') into an empty deployment: no log "
                    "records, no read-model rows, no result objects (exit 2 otherwise).")
    for p in (b, r):
        p.add_argument("--accept-unverified", action="store_true",
                       help="accept a format-1 backup, which has no checksums (its log and "
                            "read-model files are still checked against the manifest's counts)")
        p.add_argument("dir", metavar="DIR", help="the backup directory")
        add_log_arguments(p)
        p.add_argument("--database-url", default=None, metavar="DSN",
                       help="the read model (env CHRONOLOG_DATABASE_URL; default: the "
                            "embedded PostgreSQL of --data-dir)")
        p.add_argument("--results", default=None, metavar="DIR",
                       help="the result store (default <data dir>/results)")
    b.add_argument("verify_dir", nargs="?", metavar="DIR",
                   help="'chronolog backup verify DIR': check the backup in DIR (every "
                        "file's size and SHA-256, the log's integrity, every count) without "
                        "restoring it")
    b.set_defaults(func=_backup_or_verify)
    r.set_defaults(func=run_restore)


def _config(args: argparse.Namespace) -> LogConfig:
    return log_config(args)


def _results(args: argparse.Namespace) -> Path:
    return Path(args.results) if args.results else data_dir(args.data_dir) / "results"


async def _pool(dsn: str) -> asyncpg.Pool:
    try:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, timeout=10)
    except Exception as exc:  # noqa: BLE001 - any connect failure is configuration
        raise UsageError(f"invalid database-url: cannot connect ({exc})") from None
    assert pool is not None
    return pool


# ------------------------------------------------------------------------------ backup


async def _backup(args: argparse.Namespace, cfg: LogConfig, out: Path) -> dict[str, Any]:
    async with existing_database(args, "backup") as dsn:
        pool = await _pool(dsn)
        try:
            read_model = await dump(pool, out / "readmodel")
        except BackupMismatch as exc:
            raise UsageError(f"invalid database-url: {exc}") from None
        finally:
            await pool.close()
    if cfg.kind == "sqlite":
        counts = await asyncio.to_thread(backup_file, Path(cfg.target), out / "log.db")
        log_part: dict[str, Any] = {"kind": "sqlite", "file": "log.db",
                                    "prefix": cfg.topics.prefix, "records": counts}
    else:
        log = await open_existing_log(cfg)
        try:
            log_part = await _backup_kafka(log, out)
        except LogError as exc:
            raise UsageError(f"invalid log 'kafka://{cfg.target}': {exc}") from None
        finally:
            await log.close()
    results = _results(args)
    objects = await asyncio.to_thread(_copy_results, results, out / "results")
    return {
        "format": FORMAT, "formatVersion": FORMAT_VERSION,
        "createdAt": utc_now().isoformat().replace("+00:00", "Z"),
        "log": log_part,
        "readModel": {"folder": "readmodel", **read_model},
        "results": {"folder": "results", "objects": objects} if objects is not None else None,
    }


def _copy_results(source: Path, target: Path) -> int | None:
    """Copy the result store (None: there is none); the objects in ``target`` after it."""
    if not source.is_dir():
        return None
    shutil.copytree(source, target, dirs_exist_ok=True)
    return sum(1 for p in target.rglob("*") if p.is_file())


def _backup_or_verify(args: argparse.Namespace) -> int:
    if args.verify_dir is None:
        return run_backup(args)
    if args.dir != "verify":
        raise UsageError(f"invalid argument '{args.verify_dir}': 'chronolog backup' takes one "
                         "DIR ('chronolog backup verify DIR' checks a backup)")
    return run_verify(args)


def run_backup(args: argparse.Namespace) -> int:
    """Execute ``chronolog backup``."""
    cfg = _config(args)
    if cfg.kind == "sqlite" and not Path(cfg.target).is_file():
        raise UsageError(f"invalid log '{cfg.target}': no such file")
    out = Path(args.dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"invalid dir '{out}': not an empty directory (a backup goes into a "
                         "new or empty one)")
    out.mkdir(parents=True, exist_ok=True)
    manifest = asyncio.run(_backup(args, cfg, out))
    manifest["files"] = file_entries(out)
    manifest["manifestSha256"] = manifest_checksum(manifest)
    write_atomically(out / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    rm = manifest["readModel"]["tables"]
    print(f"backup: {sum(manifest['log']['records'].values())} log records, "
          f"{sum(rm.values())} read-model rows in {len(rm)} tables, "
          f"{(manifest['results'] or {}).get('objects', 0)} result objects -> {out}")
    return 0


# ------------------------------------------------------------------------------ restore
#
# A restore first verifies the whole backup (chronolog.cli.backup_check), then checks the
# target is empty, then stages every part beside the target — the SQLite log as
# ``.<log>.restore-staging`` next to it, the result store as ``.<results>.restore-staging``
# next to it, the read model in a staging schema — and only then makes them visible: it writes
# the journal ``<log>.restore.json`` (which backup, by the SHA-256 of its manifest), swaps the
# read model in (one transaction), renames the result store and the log over their targets
# and removes the journal. Killed before the journal, the target is as it was and the next
# restore removes the leftovers; killed after it, the next restore of the same backup finds
# the journal, accepts the parts already put in place (they are this backup's) and does the
# whole commit again. A Kafka log cannot be staged (records appended to a topic stay): its
# records go in after the read model is staged and before it is swapped in.


def _staging(path: Path) -> Path:
    return path.with_name(f".{path.name}.restore-staging")


def _journal(target: Path) -> Path:
    return target.with_name(f"{target.name}.restore.json")


def _resuming(target: Path, digest: str) -> bool:
    """True if an interrupted restore of the same backup left its journal next to the log."""
    journal = _journal(target)
    try:
        doc = json.loads(journal.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as exc:
        raise UsageError(f"invalid log '{target}': {journal} unreadable ({exc})") from None
    if doc.get("manifest") != digest:
        raise UsageError(f"invalid log '{target}': an interrupted restore of another backup "
                         f"({doc.get('backup')}) left {journal.name}; run that restore again "
                         "to finish it")
    return True


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _replace(staged: Path, target: Path) -> None:
    """Rename ``staged`` over ``target`` (a directory: over an empty or restored one)."""
    if target.is_dir():
        shutil.rmtree(target)
    os.replace(staged, target)


def _commit_log(staged: Path, target: Path) -> int:
    """Rename the staged log over ``target`` (its old write-ahead log folded in and removed
    first, so none is applied to the new file), then remove the journal; the records."""
    if target.exists():
        conn = sqlite3.connect(str(target))
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    for leftover in ("-wal", "-shm"):
        Path(f"{target}{leftover}").unlink(missing_ok=True)
    forget_members(target)  # the old deployment's processes are no members of the new log
    os.replace(staged, target)
    fsync_directory(target.parent)
    _journal(target).unlink()
    return sum(record_counts(target).values())


def _objects(results: Path) -> int:
    return sum(1 for p in results.rglob("*") if p.is_file())


def _check_empty(target: Path, results: Path) -> None:
    """The target log and result store hold nothing (a UsageError naming what they hold)."""
    if target.exists():
        try:
            counts = record_counts(target)
        except Exception as exc:  # noqa: BLE001 - not an SQLite file: not ours to overwrite
            raise UsageError(f"invalid log '{target}': exists and is not a chronolog log "
                             f"({exc})") from None
        if sum(counts.values()):
            topic, n = max(counts.items(), key=lambda kv: kv[1])
            raise UsageError(f"invalid log '{target}': not empty ({n} records in {topic}); "
                             "restore goes into an empty deployment")
    _check_results_empty(results)


def _check_results_empty(results: Path) -> None:
    if results.is_dir() and any(results.iterdir()):
        raise UsageError(f"invalid results '{results}': not empty; restore goes into an empty "
                         "deployment")


def _stage_log(backup: Path, target: Path) -> Path:
    """The backed-up log file restored next to ``target``, synced (renamed over it later)."""
    staged = _staging(target)
    staged.unlink(missing_ok=True)
    restore_file(backup, staged)
    with staged.open("rb") as f:
        os.fsync(f.fileno())
    return staged


def _stage_results(folder: Path, manifest: dict[str, Any], results: Path) -> Path | None:
    if not manifest.get("results"):
        return None
    staged = _staging(results)
    _remove(staged)
    _copy_results(folder / manifest["results"]["folder"], staged)
    return staged


async def _restore(args: argparse.Namespace, cfg: LogConfig, folder: Path,
                   checked: Verified) -> dict[str, Any]:
    manifest = checked.manifest
    kafka = None
    if cfg.kind == "kafka":
        topics = dataclasses.replace(cfg.topics, partitions=int(manifest["log"]["partitions"]))
        kafka = open_log(dataclasses.replace(cfg, topics=topics))
        try:
            await kafka.start()
        except (LogError, OSError) as exc:
            raise UsageError(f"cannot open log kafka:{cfg.target}: {exc}") from None
    try:
        return await _restore_into(args, cfg, folder, checked, kafka)
    finally:
        if kafka is not None:
            await kafka.close()


async def _restore_into(args: argparse.Namespace, cfg: LogConfig, folder: Path,
                        checked: Verified, kafka: Any) -> dict[str, Any]:
    manifest = checked.manifest
    target, results = Path(cfg.target), _results(args)
    resuming = kafka is None and _resuming(target, checked.digest)
    if kafka is not None:
        _check_results_empty(results)
        await _check_kafka_empty(kafka, manifest)
    elif not resuming:
        _check_empty(target, results)
    async with database(args) as dsn:
        pool = await _pool(dsn)
        try:
            schema = await current_schema(pool)
            try:
                lease = await ProjectionLease.exclusive(pool, schema, "main", role="restore")
            except LeaseHeld as exc:
                raise UsageError(f"invalid database-url: {exc}; restore goes into a stopped, "
                                 "empty deployment") from None
            try:
                why = None if resuming else await emptiness(pool)
                if why is not None:
                    raise UsageError(f"invalid database-url: the read model is not empty "
                                     f"({why}); restore goes into an empty deployment")
                await drop_stages(pool)
                return await _stage_and_commit(pool, dsn, schema, cfg, folder, checked,
                                               results, kafka)
            finally:
                await lease.release()
        finally:
            await pool.close()


async def _stage_and_commit(pool: asyncpg.Pool, dsn: str, schema: str, cfg: LogConfig,
                            folder: Path, checked: Verified, results: Path,
                            kafka: Any) -> dict[str, Any]:
    """Stage every part, then make it visible (the section comment above)."""
    manifest, target = checked.manifest, Path(cfg.target)
    rm = manifest["readModel"]
    staged_log = staged_results = None
    staged_schema: str | None = None
    try:
        if kafka is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            staged_log = await asyncio.to_thread(_stage_log, folder / manifest["log"]["file"],
                                                 target)
        results.parent.mkdir(parents=True, exist_ok=True)
        staged_results = await asyncio.to_thread(_stage_results, folder, manifest, results)
        try:
            staged_schema, loaded = await stage(dsn, folder / rm["folder"], rm)
        except BackupMismatch as exc:
            raise UsageError(f"invalid backup '{folder}': {exc}") from None
        records = 0
        if kafka is not None:
            records = await _restore_kafka_into(kafka, folder, manifest, dsn, staged_schema)
        else:
            await asyncio.to_thread(write_atomically, _journal(target), (json.dumps(
                {"backup": str(folder), "manifest": checked.digest,
                 "schema": staged_schema}) + "\n").encode())
        async with pool.acquire() as conn:
            await swap_in(conn, staged_schema, schema)
        staged_schema = None
        if staged_results is not None:
            await asyncio.to_thread(_replace, staged_results, results)
            staged_results = None
        if staged_log is not None:
            records = await asyncio.to_thread(_commit_log, staged_log, target)
            staged_log = None
    finally:  # left only by a failure before the commit
        for path in (staged_log, staged_results):
            if path is not None:
                await asyncio.to_thread(_remove, path)
        if staged_schema is not None:
            await drop_schema(pool, staged_schema)
    objects = await asyncio.to_thread(_objects, results) if manifest.get("results") else 0
    return {"records": records, "rows": sum(loaded.values()), "tables": len(loaded),
            "objects": objects}


def run_restore(args: argparse.Namespace) -> int:
    """Execute ``chronolog restore``."""
    cfg = _config(args)
    folder = Path(args.dir)
    checked = verify(folder, accept_unverified=args.accept_unverified)
    kind = checked.manifest["log"]["kind"]
    if cfg.kind == "kafka" and kind != "kafka":
        raise UsageError(f"invalid dir '{folder}': a backup of an SQLite log; restore it "
                         "with --log sqlite:///... or --data-dir")
    if cfg.kind != "kafka" and kind != "sqlite":
        raise UsageError(f"invalid dir '{folder}': a backup of a Kafka log; restore it with "
                         "--log kafka://...")
    try:
        done = asyncio.run(_restore(args, cfg, folder, checked))
    except (SwapBusy, MigrationError, LogError, OSError, asyncpg.PostgresError,
            asyncpg.InterfaceError) as exc:
        text = str(exc).replace("\n", " ")
        again = ("restore again into a fresh CHRONOLOG_TOPIC_PREFIX (records it appended "
                 "stay)" if cfg.kind == "kafka" else "run the same restore again (it removes "
                 "what this one staged, or finishes the commit this one began)")
        print(f"error: restore stopped: {type(exc).__name__}: {text}; {again}",
              file=sys.stderr)
        return 1
    print(f"restore: {done['records']} log records -> {cfg.target}, {done['rows']} read-model "
          f"rows in {done['tables']} tables, {done['objects']} result objects", file=sys.stdout)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Execute ``chronolog backup verify DIR``."""
    folder = Path(args.verify_dir)
    print(verify(folder, accept_unverified=args.accept_unverified).summary(folder))
    return 0


# ------------------------------------------------------------------------------ Kafka
#
# A Kafka log is copied record by record: every topic under the prefix but ``state`` (the
# processors' snapshots name offsets of ``events``, which a restore renumbers; they are
# derived data, and a processor without them folds ``events``), each record with its
# partition, offset, key, value, headers and timestamp, and the committed offsets of every
# consumer group under the prefix. A restore appends the records in order into empty topics
# (without transactions: offsets are then dense, 0, 1, 2, ... where the original had gaps for
# its transaction markers) and translates every stored offset — the read model's projection
# offsets and the groups' committed offsets — from the old numbering to the new one.


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


async def _backup_kafka(log: Any, out: Path) -> dict[str, Any]:
    folder = out / "kafka"
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    topics = {t: n for t, n in (await log.prefixed_topics()).items() if t != log.topics.state}
    counts: dict[str, int] = {}
    for topic, n in topics.items():
        lines: list[bytes] = []
        for p in range(n):
            async for recs in read_partition(log, topic, p):
                lines.extend(orjson.dumps({
                    "p": r.partition, "o": r.offset, "k": _b64(r.key), "v": _b64(r.value),
                    "h": [[k, _b64(v)] for k, v in r.headers], "t": r.timestamp_ms,
                }) + b"\n" for r in recs)
        counts[topic] = len(lines)
        await asyncio.to_thread((folder / f"{topic}.jsonl").write_bytes, b"".join(lines))
    groups: dict[str, list[list[Any]]] = {}
    for group in await log.prefixed_groups():
        stored = []
        for topic, n in topics.items():
            for p in range(n):
                off = await log.committed(group, topic, p)
                if off is not None:
                    stored.append([topic, p, off])
        if stored:
            groups[group] = stored
    return {"kind": "kafka", "folder": "kafka", "prefix": log.topics.prefix,
            "partitions": log.topics.partitions, "topics": topics, "records": counts,
            "groups": groups}


def _renamed(name: str, old: str, new: str) -> str:
    return new + name[len(old):] if name.startswith(old) else name


class _Renumbering:
    """Old offsets -> new offsets of each restored topic-partition (new names)."""

    def __init__(self) -> None:
        self.old: dict[tuple[str, int], list[int]] = {}
        self.new: dict[tuple[str, int], list[int]] = {}
        self.end: dict[tuple[str, int], int] = {}

    def next_offset(self, tp: tuple[str, int], old_next: int) -> int:
        """The new next offset for a stored old next offset: the new offset of the first
        restored record at or after it, else the new end."""
        olds = self.old.get(tp, [])
        i = bisect.bisect_left(olds, old_next)
        return self.new[tp][i] if i < len(olds) else self.end.get(tp, 0)


async def _check_kafka_empty(log: Any, manifest: dict[str, Any]) -> None:
    old, new = manifest["log"]["prefix"], log.topics.prefix
    for topic, n in manifest["log"]["topics"].items():
        name = _renamed(topic, old, new)
        try:
            have = await log.partitions_for(name)
        except LogError:
            continue  # not there: restore creates it
        for p in range(have):
            end = await log.end_offset(name, p)
            if end:
                raise UsageError(f"invalid log 'kafka://{log.bootstrap_servers}': not empty "
                                 f"(topic {name} partition {p} has records up to offset "
                                 f"{end}); restore goes into an empty deployment (records "
                                 "appended by an interrupted restore stay: restore into a "
                                 "fresh CHRONOLOG_TOPIC_PREFIX, or delete the topics under "
                                 f"'{new}')")
        if have != n:
            raise UsageError(f"invalid log 'kafka://{log.bootstrap_servers}': topic {name} has "
                             f"{have} partitions, the backup's {n}")


async def _restore_kafka_into(log: Any, folder: Path, manifest: dict[str, Any], dsn: str,
                              staged: str) -> int:
    """Append the backup's records and translate the stored offsets of the read model staged
    in schema ``staged``; the records appended."""
    renumber = await _restore_kafka(log, folder, manifest)
    old, new = manifest["log"]["prefix"], log.topics.prefix

    def moved(topic: str, p: int, old_next: int) -> tuple[str, int] | None:
        if topic not in manifest["log"]["topics"]:
            return None
        name = _renamed(topic, old, new)
        return name, renumber.next_offset((name, p), old_next)

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1,
                                     server_settings={"search_path": quote(staged)})
    assert pool is not None
    try:
        await renumber_offsets(pool, moved)
    finally:
        await pool.close()
    return sum(len(v) for v in renumber.new.values())


async def _restore_kafka(log: Any, folder: Path, manifest: dict[str, Any]) -> _Renumbering:
    info = manifest["log"]
    old, new = info["prefix"], log.topics.prefix
    classes = [t[len(old) + len("ready."):] for t in info["topics"]
               if t.startswith(f"{old}ready.")]
    await log.ensure_topics(classes or ("default",))
    renumber = _Renumbering()
    for topic, n in info["topics"].items():
        name = _renamed(topic, old, new)
        await log.ensure_topic(name, n)
        await log.add_partitions(name, n)  # a topic grown after creation (docs §18)
        data = await asyncio.to_thread((folder / info["folder"] / f"{topic}.jsonl").read_bytes)
        rows = [orjson.loads(line) for line in data.splitlines() if line]
        for i in range(0, len(rows), 500):
            chunk = rows[i:i + 500]
            positions = await log.append([OutRecord(
                name, _unb64(r["k"]), _unb64(r["v"]) or b"", r["p"],
                tuple((k, _unb64(v) or b"") for k, v in r["h"])) for r in chunk])
            for r, pos in zip(chunk, positions, strict=True):
                tp = (name, r["p"])
                renumber.old.setdefault(tp, []).append(r["o"])
                renumber.new.setdefault(tp, []).append(pos.offset)
                renumber.end[tp] = pos.offset + 1
    # the snapshots' topic is not backed up; it keeps the partition count of events
    await log.add_partitions(log.topics.state, await log.partitions_for(log.topics.events))
    for group, stored in info["groups"].items():
        offsets = {}
        for topic, p, off in stored:
            tp = (_renamed(topic, old, new), p)
            offsets[tp] = renumber.next_offset(tp, off)
        await log.set_committed(_renamed(group, old, new), offsets)
    return renumber
