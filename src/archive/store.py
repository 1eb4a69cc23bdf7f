"""Writing and reading the archive (docs/design.md §19).

``ArchiveWriter(directory).append(partition, records, start=, end=)`` archives a run of
consecutive records of one partition of ``events`` covering the log positions
``[start, end)``: ``start`` defaults to what the partition's archive already ends at (or the
first record's offset in an empty archive), ``end`` to the last record's offset + 1 — pass
them when Kafka's transaction markers sit at the edges. Records that start below the
archived end are a retry: the defaults are then the range of the entry they begin. One call
writes one segment file and then one manifest entry, each atomically (a temporary file,
fsync, rename, fsync of the folder), so a crash leaves either no trace, or a segment file
that no entry lists yet (the retry rewrites it), or both.

Appends keep a partition's archive one contiguous, hash-chained run:

* a range starting at the archived end is written;
* the very range of an existing entry with the same records (a retry, or a resumed loop) is
  a no-op: the entry is returned and nothing is written;
* anything else is refused with ``ArchiveRefused`` naming the partition and both ranges — a
  range that overlaps the archive differently, one with other records than archived, or one
  that would leave a gap after the archived end. Nothing is written then.

One writer per archive directory (the writer keeps each partition's entries in memory after
reading them once). ``read_archive`` and ``archived_end`` only read: a reader verifies each
segment's SHA-256 against its entry before yielding its records (``SegmentError`` naming the
file otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from chronolog.archive.format import (
    FORMAT,
    GENESIS,
    MANIFEST,
    MARKER,
    VERSION,
    ArchiveError,
    Entry,
    ManifestError,
    SegmentError,
    canonical,
    decode_segment,
    encode_segment,
    parse_entry,
    parse_segment_name,
    partition_dir,
    segment_name,
    sha256_hex,
    split_lines,
)
from chronolog.files import write_atomically
from chronolog.log.port import Record


class ArchiveRefused(ArchiveError):
    """An append that would break the archive's run (overlap, gap, other records)."""


class NotAnArchive(ArchiveError):
    """A directory that does not exist or has no ``ARCHIVE`` marker."""


def check_archive(directory: Path) -> None:
    """``NotAnArchive`` unless ``directory`` holds an archive (its ``ARCHIVE`` marker)."""
    if not directory.is_dir():
        what = "not a directory" if directory.exists() else "no such directory"
        raise NotAnArchive(f"invalid archive '{directory}': {what}")
    marker = directory / MARKER
    try:
        ok = marker.is_file() and _marker_ok(marker.read_bytes())
    except OSError:
        ok = False
    if not ok:
        raise NotAnArchive(f"invalid archive '{directory}': not an archive (no valid {MARKER} "
                           "file)")


def _marker_ok(data: bytes) -> bool:
    return data == canonical({"format": FORMAT, "version": VERSION}) + b"\n"


def read_entries(directory: Path, partition: int) -> list[Entry]:
    """A partition's manifest entries in order (``ManifestError`` naming a bad line)."""
    path = directory / partition_dir(partition) / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines, complete = split_lines(data)
    if not complete:
        raise ManifestError(f"{path}: the last line is torn (no newline)")
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entries.append(parse_entry(line))
        except ManifestError as exc:
            raise ManifestError(f"{path} line {n}: {exc}") from None
    return entries


def archived_partitions(directory: Path) -> list[int]:
    """The partitions that have a folder in the archive, ascending."""
    found = []
    for child in directory.iterdir():
        name = child.name
        if child.is_dir() and len(name) == 5 and name[0] == "p" and name[1:].isdigit():
            found.append(int(name[1:]))
    return sorted(found)


def archived_end(directory: Path, partition: int) -> int | None:
    """The next log position after what is archived of ``partition`` (None: nothing is)."""
    entries = read_entries(directory, partition)
    return entries[-1].end if entries else None


def read_segment(directory: Path, entry: Entry) -> list[Record]:
    """One segment's records, after checking the file's SHA-256 against its entry."""
    path = directory / partition_dir(entry.partition) / entry.segment
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SegmentError(f"segment {path}: missing") from None
    if sha256_hex(data) != entry.sha256:
        raise SegmentError(f"segment {path}: SHA-256 {sha256_hex(data)} does not match the "
                           f"manifest's {entry.sha256}")
    try:
        return decode_segment(data)[1]
    except SegmentError as exc:
        raise SegmentError(f"segment {path}: {exc}") from None


def read_archive(directory: Path, partition: int, start: int = 0) -> Iterator[Record]:
    """The archived records of ``partition`` with offsets from ``start`` on, in order, each
    segment's checksum verified before its records are yielded."""
    check_archive(directory)
    for entry in read_entries(directory, partition):
        if entry.end <= start:
            continue
        for record in read_segment(directory, entry):
            if record.offset >= start:
                yield record


class ArchiveWriter:
    """Appends segments to an archive directory (created with its marker if new)."""

    def __init__(self, directory: Path | str, topic: str = "chronolog.events") -> None:
        self.directory = Path(directory)
        self.topic = topic
        self._entries: dict[int, list[Entry]] = {}
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = self.directory / MARKER
        if not marker.exists():
            write_atomically(marker, canonical({"format": FORMAT, "version": VERSION}) + b"\n")
        check_archive(self.directory)

    def entries(self, partition: int) -> list[Entry]:
        if partition not in self._entries:
            self._entries[partition] = read_entries(self.directory, partition)
        return self._entries[partition]

    def archived_end(self, partition: int) -> int | None:
        entries = self.entries(partition)
        return entries[-1].end if entries else None

    def append(self, partition: int, records: Sequence[Record], *, start: int | None = None,
               end: int | None = None) -> Entry:
        """Archive ``records`` as the range ``[start, end)`` of ``partition``; the new entry,
        or the existing one when exactly this range with these records is archived."""
        _check_records(partition, records)
        entries = self.entries(partition)
        archived = entries[-1].end if entries else None
        if start is None and archived is not None and records[0].offset < archived:
            start, end = _retried_range(entries, records, end)
        if start is None:
            start = records[0].offset if archived is None else archived
        if end is None:
            end = records[-1].offset + 1
        if not start <= records[0].offset or not records[-1].offset < end:
            raise ArchiveRefused(f"partition {partition}: records {records[0].offset}.."
                                 f"{records[-1].offset} lie outside the range [{start}, {end})")
        if archived is not None and start != archived:
            return self._existing(partition, entries, records, start, end)
        return self._write(partition, entries, records, start, end)

    def _existing(self, partition: int, entries: list[Entry], records: Sequence[Record],
                  start: int, end: int) -> Entry:
        archived = entries[-1].end
        if start > archived:
            raise ArchiveRefused(f"partition {partition}: range [{start}, {end}) would leave a "
                                 f"gap after the archived end {archived}")
        same = next((e for e in entries if e.start == start and e.end == end), None)
        if same is None:
            raise ArchiveRefused(f"partition {partition}: range [{start}, {end}) overlaps the "
                                 f"archive (archived [{entries[0].start}, {archived}) in other "
                                 "segments)")
        if read_segment(self.directory, same) != [
                _as_archived(r, self.topic) for r in records]:
            raise ArchiveRefused(f"partition {partition}: range [{start}, {end}) is archived "
                                 f"({same.segment}) with other records")
        return same

    def _write(self, partition: int, entries: list[Entry], records: Sequence[Record],
               start: int, end: int) -> Entry:
        folder = self.directory / partition_dir(partition)
        folder.mkdir(exist_ok=True)
        name = segment_name(start, end)
        data = encode_segment(self.topic, partition, start, end, records)
        write_atomically(folder / name, data)
        entry = Entry.make(partition, name, start, end, records[0].offset, records[-1].offset,
                           len(records), sha256_hex(data),
                           entries[-1].hash if entries else GENESIS)
        write_atomically(folder / MANIFEST, b"".join(e.line() for e in [*entries, entry]))
        entries.append(entry)
        for leftover in folder.iterdir():  # another range a stopped writer began here
            rng = parse_segment_name(leftover.name)
            if rng is not None and rng[0] == start and leftover.name != name:
                leftover.unlink()
        return entry


def _retried_range(entries: list[Entry], records: Sequence[Record],
                   end: int | None) -> tuple[int | None, int | None]:
    """The range of the entry whose records these would be again (defaults of a retry)."""
    for e in entries:
        if e.first_offset == records[0].offset:
            if end is None and e.last_offset == records[-1].offset:
                end = e.end
            return e.start, end
    return records[0].offset, end


def _check_records(partition: int, records: Sequence[Record]) -> None:
    if not records:
        raise ArchiveRefused(f"partition {partition}: no records to archive")
    previous = -1
    for r in records:
        if r.partition != partition:
            raise ArchiveRefused(f"partition {partition}: a record of partition {r.partition} "
                                 f"(offset {r.offset})")
        if r.offset <= previous:
            raise ArchiveRefused(f"partition {partition}: offsets not increasing at {r.offset}")
        previous = r.offset


def _as_archived(r: Record, topic: str) -> Record:
    return Record(topic=topic, partition=r.partition, offset=r.offset, key=r.key,
                  value=r.value, headers=tuple(r.headers), timestamp_ms=r.timestamp_ms)
