"""Verifying a whole archive: ``verify(directory) -> VerifyReport`` (docs/design.md §19).

Every partition folder's manifest is read line by line and each entry checked; a problem is
reported and the walk goes on (a missing or altered segment is never skipped silently):

* ``malformed``: a line that is not a canonical entry, or a torn last line;
* ``altered``: an entry whose ``hash`` does not match its fields or that names another
  partition; a segment whose SHA-256 differs from its entry (and from every other entry of
  the partition), that does not decode, or whose header or records disagree with its entry
  (range, first/last offset, count, offsets outside the range or not increasing);
* ``missing``: an entry's segment file does not exist;
* ``reordered``: an entry starting before the previous one ends, or a segment file holding
  another entry's segment (its SHA-256 is that entry's);
* ``gap``: an entry starting after the previous one ends;
* ``chain``: an entry whose ``prev`` is not the previous entry's ``hash`` (64 zeros first);
* ``unlisted``: a segment file that no entry lists, other than the one a writer stopped
  between a segment and its entry leaves: at the archived end (any one file in a partition
  folder without a manifest yet). That leftover is not part of the archive; the next append
  there rewrites or removes it.

Dropping a partition's newest entry (or all of them, with at most one segment file) is not
visible in the archive alone: that is the live log's side of the proof (the log still holds
everything after the archived end).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from chronolog.archive.format import (
    GENESIS,
    MANIFEST,
    Entry,
    ManifestError,
    SegmentError,
    decode_segment,
    parse_entry,
    parse_segment_name,
    partition_dir,
    sha256_hex,
    split_lines,
)
from chronolog.archive.store import archived_partitions, check_archive

KINDS = ("malformed", "altered", "missing", "reordered", "gap", "chain", "unlisted")


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str
    partition: int
    segment: str  # "-" when the line names none
    detail: str

    def line(self) -> str:
        return f"PROBLEM {self.kind}: {self.partition} {self.segment} {self.detail}"


@dataclass(slots=True)
class VerifyReport:
    partitions: int = 0
    segments: int = 0
    records: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def counts(self) -> dict[str, int]:
        found = Counter(p.kind for p in self.problems)
        return {kind: found[kind] for kind in KINDS}

    def summary(self) -> str:
        seen = (f"{self.partitions} partitions, {self.segments} segments, "
                f"{self.records} records")
        if self.ok:
            return f"archive ok: {seen}; 0 problems"
        counts = ", ".join(f"{k}={v}" for k, v in self.counts().items() if v)
        return f"archive FAILED: {len(self.problems)} problems ({counts}) in {seen}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "partitions": self.partitions, "segments": self.segments,
            "records": self.records, "problem_counts": self.counts(),
            "problems": [{"kind": p.kind, "partition": p.partition, "segment": p.segment,
                          "detail": p.detail} for p in self.problems],
        }


def verify(directory: Path) -> VerifyReport:
    """Check the whole archive (``NotAnArchive`` when ``directory`` holds none)."""
    check_archive(directory)
    report = VerifyReport()
    for partition in archived_partitions(directory):
        _verify_partition(directory, partition, report)
    return report


def _verify_partition(directory: Path, partition: int, report: VerifyReport) -> None:
    folder = directory / partition_dir(partition)
    try:
        data = (folder / MANIFEST).read_bytes()
    except FileNotFoundError:
        _check_unlisted(folder, [], partition, report)  # a first append stopped midway?
        return
    report.partitions += 1
    lines, complete = split_lines(data)
    entries: list[Entry | None] = []
    for n, line in enumerate(lines, 1):
        try:
            entries.append(parse_entry(line))
        except ManifestError as exc:
            entries.append(None)
            torn = " (torn last line)" if n == len(lines) and not complete else ""
            report.problems.append(Problem("malformed", partition, "-",
                                           f"manifest line {n}: {exc}{torn}"))
    if lines and not complete and entries[-1] is not None:
        report.problems.append(Problem("malformed", partition, entries[-1].segment,
                                       f"manifest line {len(lines)}: no newline (torn)"))
    hashes = {e.sha256: e for e in entries if e is not None}
    previous: Entry | None = None
    first = True
    for entry in entries:
        if entry is not None:
            report.segments += 1
            _check_links(entry, previous, first, partition, report)
            _check_segment(folder, entry, hashes, partition, report)
        previous, first = entry, False
    _check_unlisted(folder, entries, partition, report)


def _check_unlisted(folder: Path, entries: list[Entry | None], partition: int,
                    report: VerifyReport) -> None:
    """Segment files no entry lists: a writer stopped between a segment and its entry leaves
    one at the archived end (at most one, anywhere, before the partition's first entry);
    any other points at entries dropped from the manifest."""
    listed = {e.segment for e in entries if e is not None}
    unlisted = sorted(
        (name, rng) for name, rng in ((p.name, parse_segment_name(p.name))
                                      for p in folder.iterdir())
        if rng is not None and name not in listed)
    if not entries:
        if len(unlisted) <= 1:
            return
        leftover: int | None = None
    else:
        last = entries[-1]
        leftover = last.end if last is not None else None
    for name, (start, _) in unlisted:
        if start != leftover:
            report.problems.append(Problem("unlisted", partition, name,
                                           "segment file that no manifest entry lists"))


def _check_links(entry: Entry, previous: Entry | None, first: bool, partition: int,
                 report: VerifyReport) -> None:
    def problem(kind: str, detail: str) -> None:
        report.problems.append(Problem(kind, partition, entry.segment, detail))

    if entry.expected_hash() != entry.hash:
        problem("altered", "manifest entry's hash does not match its fields")
    if entry.partition != partition:
        problem("altered", f"manifest entry names partition {entry.partition}")
    if first and entry.prev != GENESIS:
        problem("chain", "the first entry's prev is not the genesis hash")
    if previous is None:
        return  # the first entry, or the line before did not parse
    if entry.prev != previous.hash:
        problem("chain", f"prev {entry.prev[:12]} is not the hash {previous.hash[:12]} of "
                         f"{previous.segment}")
    if entry.start < previous.end:
        problem("reordered", f"starts at {entry.start}, before {previous.segment} ends at "
                             f"{previous.end}")
    elif entry.start > previous.end:
        problem("gap", f"starts at {entry.start}; {previous.segment} ends at {previous.end}")


def _check_segment(folder: Path, entry: Entry, hashes: dict[str, Entry], partition: int,
                   report: VerifyReport) -> None:
    def problem(kind: str, detail: str) -> None:
        report.problems.append(Problem(kind, partition, entry.segment, detail))

    try:
        data = (folder / entry.segment).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        problem("missing", "segment file does not exist")
        return
    digest = sha256_hex(data)
    if digest != entry.sha256:
        other = hashes.get(digest)
        if other is not None:
            problem("reordered", f"the file holds segment {other.segment}")
        else:
            problem("altered", f"SHA-256 {digest[:12]} is not the manifest's "
                               f"{entry.sha256[:12]}")
        return
    try:
        header, records = decode_segment(data)
    except SegmentError as exc:
        problem("altered", str(exc))
        return
    report.records += len(records)
    said = (entry.partition, entry.start, entry.end, entry.first_offset, entry.last_offset,
            entry.count)
    inside = (header.partition, header.start, header.end, header.first_offset,
              header.last_offset, header.count)
    offsets = [r.offset for r in records]
    actual = (offsets[0], offsets[-1], len(offsets)) if offsets else None
    if said != inside or actual != (entry.first_offset, entry.last_offset, entry.count):
        problem("altered", f"segment holds partition/start/end/first/last/count {inside} and "
                           f"records {actual}; the manifest says {said}")
    elif any(b <= a for a, b in pairwise(offsets)) or not (
            entry.start <= offsets[0] and offsets[-1] < entry.end):
        problem("altered", "record offsets not increasing inside the segment's range")
