"""What makes a backup directory trustworthy, and the check of it: ``chronolog backup verify
DIR`` runs it alone, ``chronolog restore DIR`` runs it before it writes anything.

A backup (format version 2) lists every file it holds in ``manifest.json`` under ``files``:
its path relative to DIR, its size in bytes and its SHA-256. The manifest carries its own
checksum, ``manifestSha256``: the SHA-256 of the manifest's canonical JSON (sorted keys, no
spaces) without that field, so one altered byte of the manifest is seen too (it either breaks
the JSON or changes the canonical text).

``verify(folder)`` checks, and stops at the first problem with a ``UsageError`` naming the
file and what is wrong (exit 2, one line):

1. the manifest: readable JSON, a chronolog backup, a known format version, its own checksum;
2. the file set: every listed file present with its size and SHA-256, and no file that the
   manifest does not list (a backup is exactly what its manifest says: a stray file is a
   sign of two backups mixed, or of a hand edit, and is refused);
3. the contents: the SQLite log copy passes ``PRAGMA integrity_check`` and holds the
   manifest's record count per topic; every Kafka topic file parses, line by line, to its
   record count; every read-model COPY file parses to its row count.

Format version 1 (backups made before checksums) has no ``files``: it is refused unless the
operator says ``--accept-unverified`` — then steps 1 and 3 still run (a truncated log or a
cut COPY file is still refused), but an altered byte inside a well-formed file, a changed
result object or a stray file cannot be seen.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from chronolog.cli.errors import UsageError
from chronolog.log.sqlite import checked_counts
from chronolog.projections.backup import BackupMismatch, copy_rows

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "Verified", "file_entries",
           "manifest_checksum", "verify"]

FORMAT = "chronolog.backup"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


@dataclass
class Verified:
    """A checked backup: its manifest, and what the check covered."""

    manifest: dict[str, Any]
    digest: str  # SHA-256 of manifest.json as stored: names this backup
    files: int
    bytes: int
    checksums: bool  # False: a format-1 backup accepted without them

    def summary(self, folder: Path) -> str:
        m = self.manifest
        rm = m["readModel"]["tables"]
        objects = (m.get("results") or {}).get("objects", 0)
        sums = "sizes and SHA-256 match" if self.checksums else "NO checksums (format 1)"
        return (f"backup ok: {folder}: {self.files} files, {self.bytes} bytes, {sums}; "
                f"{sum(m['log']['records'].values())} log records ({m['log']['kind']}), "
                f"{sum(rm.values())} read-model rows in {len(rm)} tables, "
                f"{objects} result objects")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _listing(folder: Path) -> list[str]:
    """Every file under ``folder`` but the manifest, as POSIX paths relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if not p.is_dir() and p.relative_to(folder).as_posix() != MANIFEST)


def file_entries(folder: Path) -> dict[str, dict[str, Any]]:
    """``files`` of a manifest: every file of the backup with its size and SHA-256."""
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": _sha256(folder / name)}
            for name in _listing(folder)}


def manifest_checksum(doc: dict[str, Any]) -> str:
    """The SHA-256 of the manifest's canonical JSON without ``manifestSha256``."""
    body = {k: v for k, v in doc.items() if k != "manifestSha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def _bad(folder: Path, what: str) -> UsageError:
    return UsageError(f"invalid backup '{folder}': {what}")


def _read_manifest(folder: Path, accept_unverified: bool) -> tuple[dict[str, Any], str]:
    if not folder.is_dir():
        raise _bad(folder, "no such directory")
    try:
        raw = (folder / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise _bad(folder, f"no {MANIFEST} (not a backup, or an incomplete one)") from None
    except OSError as exc:
        raise _bad(folder, f"{MANIFEST} unreadable ({exc})") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise _bad(folder, f"{MANIFEST} unreadable ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _bad(folder, f"{MANIFEST} is not a chronolog backup")
    version = doc.get("formatVersion")
    if version == 1:
        if not accept_unverified:
            raise _bad(folder, f"{MANIFEST} is formatVersion 1, which has no checksums; "
                               "restore it knowingly with --accept-unverified")
    elif version != FORMAT_VERSION:
        raise _bad(folder, f"{MANIFEST} formatVersion {version!r} (this chronolog reads "
                           f"{FORMAT_VERSION}, and 1 with --accept-unverified)")
    elif doc.get("manifestSha256") != manifest_checksum(doc):
        raise _bad(folder, f"{MANIFEST} does not match its manifestSha256 (altered)")
    return doc, hashlib.sha256(raw).hexdigest()


def _structure(folder: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """The parts the manifest must name, normalised; a ``UsageError`` naming what lacks."""
    try:
        rm = doc["readModel"]
        rm = {**rm, "folder": rm.get("folder", "readmodel"), "tables": dict(rm["tables"]),
              "migrations": list(rm["migrations"])}
        log = doc["log"]
        kind = log["kind"]
        dict(log["records"])
        if kind == "sqlite":
            str(log["file"])
        elif kind == "kafka":
            dict(log["topics"])
            dict(log["groups"])
            int(log["partitions"])
            str(log["folder"])
        else:
            raise _bad(folder, f"a backup of an unknown log kind {kind!r}")
        if doc.get("formatVersion") == FORMAT_VERSION:
            files = {str(k): (int(v["bytes"]), str(v["sha256"]))
                     for k, v in dict(doc["files"]).items()}
        else:
            files = {}
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(folder, f"{MANIFEST} lacks {exc}") from None
    return {**doc, "readModel": rm, "_files": files}


def _parts(doc: dict[str, Any]) -> list[str]:
    """The files the log and read-model parts name (they must exist in any format)."""
    log, rm = doc["log"], doc["readModel"]
    names = [log["file"]] if log["kind"] == "sqlite" else \
        [f"{log['folder']}/{topic}.jsonl" for topic in log["topics"]]
    return names + [f"{rm['folder']}/{table}.copy" for table in rm["tables"]]


def _check_files(folder: Path, doc: dict[str, Any]) -> tuple[int, int]:
    listed: dict[str, tuple[int, str]] = doc["_files"]
    for name in _parts(doc):
        if name not in listed:
            raise _bad(folder, f"{name} is not listed in {MANIFEST}")
    for name, (size, digest) in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            raise _bad(folder, f"{name} is missing")
        have = path.stat().st_size
        if have != size:
            raise _bad(folder, f"{name} is {have} bytes, the manifest says {size} "
                               "(truncated or altered)")
        if _sha256(path) != digest:
            raise _bad(folder, f"{name} does not match its SHA-256 (altered)")
    for name in _listing(folder):
        if name not in listed:
            raise _bad(folder, f"{name} is not listed in {MANIFEST} (a backup holds exactly "
                               "the files its manifest lists)")
    return len(listed), sum(size for size, _ in listed.values())


def _check_contents(folder: Path, doc: dict[str, Any]) -> None:
    log, rm = doc["log"], doc["readModel"]
    for name in _parts(doc):
        if not (folder / name).is_file():
            raise _bad(folder, f"{name} is missing")
    want = {t: int(n) for t, n in log["records"].items() if int(n)}
    if log["kind"] == "sqlite":
        try:
            have = {t: n for t, n in checked_counts(folder / log["file"]).items() if n}
        except ValueError as exc:
            raise _bad(folder, f"{log['file']} {exc}") from None
        if have != want:
            raise _bad(folder, f"{log['file']} holds {sum(have.values())} records, the "
                               f"manifest says {sum(want.values())} ({_first_diff(have, want)})")
    else:
        for topic in log["topics"]:
            name = f"{log['folder']}/{topic}.jsonl"
            n = 0
            for line in (folder / name).read_bytes().splitlines():
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise _bad(folder, f"{name} line {n + 1} is not a record") from None
                n += 1
            if n != want.get(topic, 0):
                raise _bad(folder, f"{name} holds {n} records, the manifest says "
                                   f"{want.get(topic, 0)}")
    for table, rows in rm["tables"].items():
        name = f"{rm['folder']}/{table}.copy"
        try:
            n = copy_rows(folder / name)
        except BackupMismatch as exc:
            raise _bad(folder, f"{name} {exc}") from None
        if n != int(rows):
            raise _bad(folder, f"{name} holds {n} rows, the manifest says {rows}")


def _first_diff(have: dict[str, int], want: dict[str, int]) -> str:
    topic = next(t for t in sorted(have.keys() | want.keys()) if have.get(t) != want.get(t))
    return f"topic {topic}: {have.get(topic, 0)} vs {want.get(topic, 0)}"


def verify(folder: Path, *, accept_unverified: bool = False) -> Verified:
    """Check the backup in ``folder`` (module docstring); the first problem is a
    ``UsageError`` naming the file and what is wrong."""
    raw, digest = _read_manifest(folder, accept_unverified)
    doc = _structure(folder, raw)
    checksums = doc.get("formatVersion") == FORMAT_VERSION
    files, size = _check_files(folder, doc) if checksums else (len(_listing(folder)), sum(
        (folder / n).stat().st_size for n in _listing(folder)))
    _check_contents(folder, doc)
    del doc["_files"]
    return Verified(doc, digest, files, size, checksums)
