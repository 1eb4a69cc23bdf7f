"""``chronolog backup DIR`` / ``chronolog restore DIR``: the whole deployment's data — the
log, the read model and the result store — into a directory, and back into an empty
deployment.

    chronolog backup DIR  [--data-dir D | --log URL] [--database-url DSN] [--results R]
    chronolog restore DIR [--data-dir D | --log URL] [--database-url DSN] [--results R]

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
offsets), and every result the log names is there. ``DIR/manifest.json`` is written last:
a directory without it is an incomplete backup.

``restore`` writes a backup into an empty deployment — no log records, no read-model rows,
no result objects — and refuses anything else (exit 2, naming what is not empty) before
writing anything. Everything a decision needs survives: the events (outbox intents of
effects, request keys of manual triggers, fences), the processors' and the effect
runners' committed offsets. Started on the restored data, a processor answers a repeated
trigger with its original run, and the effect runner performs an effect that had not been
performed yet — once.

A Kafka restore appends the records into empty topics under the target prefix (which may
differ from the backup's) without transactions, so their offsets are renumbered densely;
the read model's projection offsets and the groups' committed offsets are translated to
the new numbering (an old next offset becomes the new offset of the first record at or
after it).

Exit status: 0 done; 2 bad input (a non-empty target or backup directory, a missing or
invalid manifest, a read model of other migrations, a backup of the other log kind) with
one line on stderr.
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
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from chronolog.cli.errors import UsageError
from chronolog.cli.flags import database, existing_database
from chronolog.cli.log_reader import add_log_arguments, log_config, open_existing_log
from chronolog.environment import utc_now
from chronolog.log.port import LogError, OutRecord
from chronolog.log.reading import read_partition
from chronolog.log.sqlite import backup_file, record_counts, restore_file
from chronolog.projections.backup import (
    BackupMismatch,
    dump,
    emptiness,
    load,
    renumber_offsets,
)
from chronolog.settings import LogConfig, data_dir, open_log

FORMAT = "chronolog.backup"
FORMAT_VERSION = 1


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
        p.add_argument("dir", metavar="DIR", help="the backup directory")
        add_log_arguments(p)
        p.add_argument("--database-url", default=None, metavar="DSN",
                       help="the read model (env CHRONOLOG_DATABASE_URL; default: the "
                            "embedded PostgreSQL of --data-dir)")
        p.add_argument("--results", default=None, metavar="DIR",
                       help="the result store (default <data dir>/results)")
    b.set_defaults(func=run_backup)
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
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / "manifest.json")
    rm = manifest["readModel"]["tables"]
    print(f"backup: {sum(manifest['log']['records'].values())} log records, "
          f"{sum(rm.values())} read-model rows in {len(rm)} tables, "
          f"{(manifest['results'] or {}).get('objects', 0)} result objects -> {out}")
    return 0


# ------------------------------------------------------------------------------ restore


def load_manifest(folder: Path) -> dict[str, Any]:
    """The backup's manifest, checked; any problem is a ``UsageError`` naming it."""
    path = folder / "manifest.json"
    if not folder.is_dir():
        raise UsageError(f"invalid dir '{folder}': no such directory")
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"invalid dir '{folder}': no manifest.json (not a backup, or an "
                         "incomplete one)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"invalid dir '{folder}': manifest.json unreadable ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"invalid dir '{folder}': manifest.json is not a chronolog backup")
    if doc.get("formatVersion") != FORMAT_VERSION:
        raise UsageError(f"invalid dir '{folder}': manifest formatVersion "
                         f"{doc.get('formatVersion')!r} (this chronolog reads {FORMAT_VERSION})")
    try:
        rm = doc["readModel"]
        tables, migrations = dict(rm["tables"]), list(rm["migrations"])
        kind = doc["log"]["kind"]
        log_file = folder / (doc["log"]["file"] if kind == "sqlite" else doc["log"]["folder"])
        if kind == "kafka":
            topics = dict(doc["log"]["topics"])
            dict(doc["log"]["groups"])
            int(doc["log"]["partitions"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"invalid dir '{folder}': manifest.json lacks {exc}") from None
    if kind not in ("sqlite", "kafka"):
        raise UsageError(f"invalid dir '{folder}': a backup of an unknown log kind {kind!r}")
    if kind == "sqlite" and not log_file.is_file():
        raise UsageError(f"invalid dir '{folder}': its log file {log_file.name} is missing")
    if kind == "kafka":
        for topic in topics:
            if not (log_file / f"{topic}.jsonl").is_file():
                raise UsageError(f"invalid dir '{folder}': the records of {topic} are missing")
    for name in tables:
        if not (folder / rm.get("folder", "readmodel") / f"{name}.copy").is_file():
            raise UsageError(f"invalid dir '{folder}': read-model table {name} is missing")
    doc["readModel"] = {**rm, "tables": tables, "migrations": migrations}
    return doc


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


async def _restore(args: argparse.Namespace, cfg: LogConfig, folder: Path,
                   manifest: dict[str, Any]) -> dict[str, Any]:
    # everything is checked before anything is written (an SQLite log and the result store
    # in run_restore, the Kafka topics and the read model here)
    kafka = None
    if cfg.kind == "kafka":
        if manifest["log"]["kind"] != "kafka":
            raise UsageError(f"invalid dir '{folder}': a backup of an SQLite log; restore it "
                             "with --log sqlite:///... or --data-dir")
        topics = dataclasses.replace(cfg.topics, partitions=int(manifest["log"]["partitions"]))
        kafka = open_log(dataclasses.replace(cfg, topics=topics))
        try:
            await kafka.start()
        except (LogError, OSError) as exc:
            raise UsageError(f"cannot open log kafka:{cfg.target}: {exc}") from None
    elif manifest["log"]["kind"] != "sqlite":
        raise UsageError(f"invalid dir '{folder}': a backup of a Kafka log; restore it with "
                         "--log kafka://...")
    try:
        return await _restore_into(args, cfg, folder, manifest, kafka)
    finally:
        if kafka is not None:
            await kafka.close()


async def _restore_into(args: argparse.Namespace, cfg: LogConfig, folder: Path,
                        manifest: dict[str, Any], kafka: Any) -> dict[str, Any]:
    target = Path(cfg.target)
    results = _results(args)
    if kafka is not None:
        await _check_kafka_empty(kafka, manifest)
    opened: AbstractAsyncContextManager[str] = database(args)
    async with opened as dsn:
        pool = await _pool(dsn)
        try:
            why = await emptiness(pool)
            if why is not None:
                raise UsageError(f"invalid database-url: the read model is not empty ({why}); "
                                 "restore goes into an empty deployment")
            rm = manifest["readModel"]
            try:
                loaded = await load(pool, folder / rm.get("folder", "readmodel"), rm)
            except BackupMismatch as exc:
                raise UsageError(f"invalid dir '{folder}': {exc}") from None
            if kafka is not None:
                renumber = await _restore_kafka(kafka, folder, manifest)
                old, new = manifest["log"]["prefix"], kafka.topics.prefix

                def moved(topic: str, p: int, old_next: int) -> tuple[str, int] | None:
                    if topic not in manifest["log"]["topics"]:
                        return None
                    name = _renamed(topic, old, new)
                    return name, renumber.next_offset((name, p), old_next)

                await renumber_offsets(pool, moved)
        finally:
            await pool.close()
    if kafka is not None:
        objects = None
        if manifest.get("results"):
            objects = await asyncio.to_thread(
                _copy_results, folder / manifest["results"]["folder"], results)
        return {"records": sum(len(v) for v in renumber.new.values()),
                "rows": sum(loaded.values()), "tables": len(loaded), "objects": objects or 0}
    await asyncio.to_thread(restore_file, folder / manifest["log"]["file"], target)
    objects = None
    if manifest.get("results"):
        objects = await asyncio.to_thread(_copy_results, folder / manifest["results"]["folder"],
                                          results)
    records = await asyncio.to_thread(record_counts, target)
    return {"records": sum(records.values()), "rows": sum(loaded.values()),
            "tables": len(loaded), "objects": objects or 0}


def run_restore(args: argparse.Namespace) -> int:
    """Execute ``chronolog restore``."""
    cfg = _config(args)
    folder = Path(args.dir)
    manifest = load_manifest(folder)
    if cfg.kind == "sqlite":
        _check_empty(Path(cfg.target), _results(args))
        Path(cfg.target).parent.mkdir(parents=True, exist_ok=True)
    else:
        _check_results_empty(_results(args))
    done = asyncio.run(_restore(args, cfg, folder, manifest))
    print(f"restore: {done['records']} log records -> {cfg.target}, {done['rows']} read-model "
          f"rows in {done['tables']} tables, {done['objects']} result objects", file=sys.stdout)
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
                                 f"{end}); restore goes into an empty deployment")
        if have != n:
            raise UsageError(f"invalid log 'kafka://{log.bootstrap_servers}': topic {name} has "
                             f"{have} partitions, the backup's {n}")


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
