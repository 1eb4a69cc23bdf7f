"""A verifiable archive of the ``events`` log (docs/design.md §19).

Before events are pruned from the log they are archived: per partition, compressed segment
files of consecutive records, each listed by a manifest entry that carries the segment's
SHA-256 and the hash of the entry before it (a hash chain), so that the archive plus the live
log prove the whole history. The API a pruner and an audit need:

* ``ArchiveWriter(dir, topic).append(partition, records, start=, end=)`` — write a segment and
  its entry atomically; a retried range is a no-op, an overlapping or gapped one is refused
  (``ArchiveRefused``) (``chronolog.archive.store``);
* ``read_archive(dir, partition, start=0)`` — the archived records in order, each segment's
  checksum verified; ``archived_end(dir, partition)`` — the next position after the archive;
* ``verify(dir) -> VerifyReport`` — every entry, segment, link and range checked
  (``chronolog.archive.verify``; ``chronolog archive verify DIR`` on the command line).

The format is in ``chronolog.archive.format``.
"""

from chronolog.archive.format import ArchiveError, Entry, ManifestError, SegmentError
from chronolog.archive.store import (
    ArchiveRefused,
    ArchiveWriter,
    NotAnArchive,
    archived_end,
    read_archive,
)
from chronolog.archive.verify import Problem, VerifyReport, verify

__all__ = [
    "ArchiveError",
    "ArchiveRefused",
    "ArchiveWriter",
    "Entry",
    "ManifestError",
    "NotAnArchive",
    "Problem",
    "SegmentError",
    "VerifyReport",
    "archived_end",
    "read_archive",
    "verify",
]
