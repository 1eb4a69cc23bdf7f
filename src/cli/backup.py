"""``chronolog backup DIR`` / ``chronolog restore DIR``: the whole deployment's data — the
log, the read model and the result store — into a directory, and back into an empty
deployment.

    chronolog backup DIR  [--data-dir D | --log URL] [--database-url DSN] [--results R]
    chronolog restore DIR [--data-dir D | --log URL] [--database-url DSN] [--results R]

``--data-dir D`` alone names a dev node's data: ``D/log.db``, the embedded PostgreSQL in
``D/postgres`` and ``D/results``. A backup may be taken while the deployment runs. It is
taken in the order that keeps the parts consistent: the read model first (one REPEATABLE
READ snapshot of every table, binary COPY), then the log (SQLite's online backup API: every
topic with its offsets, consumer-group offsets and owner epochs), then the result store
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

Exit status: 0 done; 2 bad input (a non-empty target or backup directory, a missing or
invalid manifest, a read model of other migrations, a Kafka log: not supported) with one
line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import asyncpg

from chronolog.cli.errors import UsageError
from chronolog.cli.flags import database, existing_database
from chronolog.cli.log_reader import add_log_arguments, log_config
from chronolog.environment import utc_now
from chronolog.log.sqlite import backup_file, record_counts, restore_file
from chronolog.projections.backup import BackupMismatch, dump, emptiness, load
from chronolog.settings import LogConfig, data_dir

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


def _sqlite(args: argparse.Namespace) -> LogConfig:
    cfg = log_config(args)
    if cfg.kind != "sqlite":
        raise UsageError(f"invalid log '{cfg.kind}://{cfg.target}': backup and restore "
                         "support the SQLite log (use the Kafka cluster's own replication "
                         "and MirrorMaker for Kafka)")
    return cfg


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
    log_path = Path(cfg.target)
    async with existing_database(args, "backup") as dsn:
        pool = await _pool(dsn)
        try:
            read_model = await dump(pool, out / "readmodel")
        except BackupMismatch as exc:
            raise UsageError(f"invalid database-url: {exc}") from None
        finally:
            await pool.close()
    counts = await asyncio.to_thread(backup_file, log_path, out / "log.db")
    results = _results(args)
    objects = await asyncio.to_thread(_copy_results, results, out / "results")
    return {
        "format": FORMAT, "formatVersion": FORMAT_VERSION,
        "createdAt": utc_now().isoformat().replace("+00:00", "Z"),
        "log": {"kind": "sqlite", "file": "log.db", "prefix": cfg.topics.prefix,
                "records": counts},
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
    cfg = _sqlite(args)
    if not Path(cfg.target).is_file():
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
        log_file = folder / doc["log"]["file"]
    except (KeyError, TypeError) as exc:
        raise UsageError(f"invalid dir '{folder}': manifest.json lacks {exc}") from None
    if not log_file.is_file():
        raise UsageError(f"invalid dir '{folder}': its log file {log_file.name} is missing")
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
    if results.is_dir() and any(results.iterdir()):
        raise UsageError(f"invalid results '{results}': not empty; restore goes into an empty "
                         "deployment")


async def _restore(args: argparse.Namespace, cfg: LogConfig, folder: Path,
                   manifest: dict[str, Any]) -> dict[str, Any]:
    target = Path(cfg.target)
    results = _results(args)
    # everything is checked before anything is written (the log and results: run_restore)
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
        finally:
            await pool.close()
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
    cfg = _sqlite(args)
    folder = Path(args.dir)
    manifest = load_manifest(folder)
    _check_empty(Path(cfg.target), _results(args))
    Path(cfg.target).parent.mkdir(parents=True, exist_ok=True)
    done = asyncio.run(_restore(args, cfg, folder, manifest))
    print(f"restore: {done['records']} log records -> {cfg.target}, {done['rows']} read-model "
          f"rows in {done['tables']} tables, {done['objects']} result objects", file=sys.stdout)
    return 0
