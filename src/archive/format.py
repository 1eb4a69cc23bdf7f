"""The archive's on-disk format: segment files and manifest entries (docs/design.md §19).

A *segment* is one gzip member (level 6, no file name, mtime 0: the same records always give
the same bytes) of UTF-8 JSON lines. Its first line is a header naming what it covers::

    {"count":N,"end":E,"first_offset":F,"format":"chronolog-archive-segment",
     "last_offset":L,"partition":P,"start":S,"topic":"chronolog.events","version":1}

and each further line is one record, oldest first::

    {"headers":[["processor","p1"]],"key":"acme/nightly","offset":F,"timestamp_ms":T,
     "value":"{...}"}

A byte string (key, value, header value) is a JSON string when it is valid UTF-8 (every
chronolog event is) and ``{"b64": "..."}`` otherwise; a missing key is ``null``. So a
segment reads back with ``zcat`` and any JSON reader.

A *manifest entry* is one canonical JSON line (sorted keys, no spaces) of a partition's
``manifest.jsonl``: the segment's file name, ``start``/``end`` (the log positions it covers:
``[start, end)``, Kafka offsets being sparse), ``first_offset``/``last_offset``/``count`` of its
records, ``sha256`` of the segment file, ``prev`` (the ``hash`` of the partition's previous
entry, 64 zeros for the first: a hash chain) and ``hash``, the SHA-256 of the entry's other
fields in the same canonical form. Anything else — another key, a non-canonical spelling,
upper-case hex, a segment name that is not its range's — is not an entry (``ManifestError``).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

from chronolog.log.port import Record

FORMAT = "chronolog-archive"
SEGMENT_FORMAT = "chronolog-archive-segment"
VERSION = 1
GENESIS = "0" * 64
MARKER = "ARCHIVE"
MANIFEST = "manifest.jsonl"
GZIP_LEVEL = 6

_HEX = frozenset("0123456789abcdef")


class ArchiveError(Exception):
    """Base class of the archive's errors."""


class ManifestError(ArchiveError):
    """A manifest line that is not a well-formed entry."""


class SegmentError(ArchiveError):
    """A segment file that cannot be read back as the entry says (checksum, format)."""


def partition_dir(partition: int) -> str:
    """``p0007``: a partition's folder under the archive directory."""
    return f"p{partition:04d}"


def segment_name(start: int, end: int) -> str:
    """A segment's file name: its range, so a retried range lands on the same file."""
    return f"{start:020d}-{end:020d}.jsonl.gz"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """A segment file name's ``(start, end)``; None for any other name."""
    head, sep, tail = name.partition("-")
    if (not sep or tail[20:] != ".jsonl.gz" or len(head) != 20 or not head.isdigit()
            or not tail[:20].isdigit()):
        return None
    return int(head), int(tail[:20])


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class Entry:
    """One manifest entry: a segment of one partition and its place in the hash chain."""

    partition: int
    segment: str
    start: int
    end: int
    first_offset: int
    last_offset: int
    count: int
    sha256: str
    prev: str
    hash: str

    @staticmethod
    def make(partition: int, segment: str, start: int, end: int, first_offset: int,
             last_offset: int, count: int, sha256: str, prev: str) -> Entry:
        entry = Entry(partition, segment, start, end, first_offset, last_offset, count, sha256,
                      prev, hash="")
        return replace(entry, hash=entry.expected_hash())

    def expected_hash(self) -> str:
        fields = asdict(self)
        del fields["hash"]
        return sha256_hex(canonical(fields))

    def line(self) -> bytes:
        return canonical(asdict(self)) + b"\n"


_INT_FIELDS = ("partition", "start", "end", "first_offset", "last_offset", "count")
_HEX_FIELDS = ("sha256", "prev", "hash")
_FIELDS = frozenset((*_INT_FIELDS, "segment", *_HEX_FIELDS))


def parse_entry(line: bytes) -> Entry:
    """One manifest line (without its newline) as an entry, or ``ManifestError``."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict) or set(obj) != _FIELDS:
        raise ManifestError("not a manifest entry (its keys differ)")
    for name in _INT_FIELDS:
        if type(obj[name]) is not int or obj[name] < 0:
            raise ManifestError(f"{name} is not a non-negative integer")
    for name in _HEX_FIELDS:
        value = obj[name]
        if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
            raise ManifestError(f"{name} is not a lower-case SHA-256")
    if not isinstance(obj["segment"], str) or parse_segment_name(obj["segment"]) != (
            obj["start"], obj["end"]):
        raise ManifestError("segment is not the file name of the entry's range")
    entry = Entry(**obj)
    if entry.line() != line + b"\n":
        raise ManifestError("not in canonical form")
    return entry


def split_lines(data: bytes) -> tuple[list[bytes], bool]:
    """A manifest's lines and whether it ends with a newline (a torn last line does not)."""
    if not data:
        return [], True
    complete = data.endswith(b"\n")
    lines = data.split(b"\n")
    return (lines[:-1] if complete else lines), complete


# --- segments -------------------------------------------------------------------------------


def _enc(data: bytes) -> Any:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(data).decode("ascii")}


def _dec(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        return base64.b64decode(value["b64"], validate=True)
    raise ValueError(f"not a byte string: {value!r}")


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    topic: str
    partition: int
    start: int
    end: int
    first_offset: int
    last_offset: int
    count: int


def encode_segment(topic: str, partition: int, start: int, end: int,
                   records: Sequence[Record]) -> bytes:
    """The segment file of ``records`` (checked by the caller: one partition, in order)."""
    raw = segment_body(topic, partition, start, end, records)
    return gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0)


def segment_body(topic: str, partition: int, start: int, end: int,
                 records: Sequence[Record]) -> bytes:
    """A segment's JSON lines before compression (bench/archive_codecs.py compares codecs
    on them)."""
    header = dict(format=SEGMENT_FORMAT, version=VERSION, topic=topic, partition=partition,
                  start=start, end=end, first_offset=records[0].offset,
                  last_offset=records[-1].offset, count=len(records))
    lines = [canonical(header)]
    lines.extend(canonical({
        "offset": r.offset, "timestamp_ms": r.timestamp_ms,
        "key": None if r.key is None else _enc(r.key), "value": _enc(r.value),
        "headers": [[name, _enc(value)] for name, value in r.headers],
    }) for r in records)
    return b"\n".join(lines) + b"\n"


def decode_segment(data: bytes) -> tuple[SegmentHeader, list[Record]]:
    """A segment file's header and records, or ``SegmentError``."""
    try:
        raw = gzip.decompress(data)
        lines = raw.split(b"\n")
        if lines[-1] != b"":
            raise ValueError("no newline at the end")
        head = orjson.loads(lines[0])
        if head.get("format") != SEGMENT_FORMAT or head.get("version") != VERSION:
            raise ValueError("not a version 1 chronolog archive segment")
        header = SegmentHeader(
            topic=str(head["topic"]), partition=int(head["partition"]),
            start=int(head["start"]), end=int(head["end"]),
            first_offset=int(head["first_offset"]), last_offset=int(head["last_offset"]),
            count=int(head["count"]))
        return header, list(_records(header, lines[1:-1]))
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError) as exc:
        raise SegmentError(f"unreadable segment: {exc}") from None


def _records(header: SegmentHeader, lines: Iterable[bytes]) -> Iterator[Record]:
    for line in lines:
        obj = orjson.loads(line)
        yield Record(
            topic=header.topic, partition=header.partition, offset=int(obj["offset"]),
            key=None if obj["key"] is None else _dec(obj["key"]), value=_dec(obj["value"]),
            headers=tuple((str(name), _dec(value)) for name, value in obj["headers"]),
            timestamp_ms=int(obj["timestamp_ms"]))
