"""The archive's rules (``chronolog.archive``, docs/design.md §19): appends keep each partition
one contiguous hash-chained run (a retried range is a no-op, an overlap or a gap is refused
and writes nothing), the reader verifies each segment, and ``verify`` reports every deletion,
swap, truncation or flipped byte of a segment or a manifest line with its kind."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronolog.archive import (
    ArchiveRefused,
    ArchiveWriter,
    NotAnArchive,
    SegmentError,
    archived_end,
    read_archive,
    verify,
)
from chronolog.archive.format import MANIFEST, decode_segment, encode_segment, partition_dir
from chronolog.log.port import Record

TOPIC = "chronolog.events"


def rec(partition: int, offset: int, value: bytes = b"", key: bytes | None = b"k",
        headers: tuple[tuple[str, bytes], ...] = ()) -> Record:
    return Record(TOPIC, partition, offset, key, value or f"v{offset}".encode(), headers,
                  1_700_000_000_000 + offset)


def run(partition: int, offsets: list[int]) -> list[Record]:
    return [rec(partition, o) for o in offsets]


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _key(r: Record) -> tuple[object, ...]:
    return (r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms)


# --- the writer's rules -----------------------------------------------------------------------


def test_a_range_starting_at_the_archived_end_extends_the_chain(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    first = w.append(0, run(0, [0, 1, 2]))
    # a transaction marker at 3: the next range starts at the archived end, not at offset 4
    second = w.append(0, run(0, [4, 5]), end=7)
    assert (first.start, first.end, second.start, second.end) == (0, 3, 3, 7)
    assert second.prev == first.hash and first.prev == "0" * 64
    assert (second.first_offset, second.last_offset, second.count) == (4, 5, 2)
    assert archived_end(tmp_path, 0) == 7 and archived_end(tmp_path, 1) is None
    assert verify(tmp_path).ok


def test_a_retried_range_with_the_same_records_is_a_no_op(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    a = w.append(0, run(0, [0, 1]))
    b = w.append(0, run(0, [2, 3]))
    before = _files(tmp_path)
    again = ArchiveWriter(tmp_path, TOPIC)  # a restarted writer, reading the manifest anew
    assert again.append(0, run(0, [0, 1]), start=0) == a
    assert again.append(0, run(0, [2, 3]), start=2, end=4) == b
    assert again.append(0, run(0, [0, 1])) == a  # the defaults of a retry: the entry's range
    assert again.append(0, run(0, [2, 3])) == b
    assert _files(tmp_path) == before


def test_a_retry_after_a_crash_between_segment_and_manifest_writes_the_same_bytes(
    tmp_path: Path,
) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    w.append(0, run(0, [0, 1]))
    manifest = tmp_path / partition_dir(0) / MANIFEST
    kept = manifest.read_bytes()
    entry = w.append(0, run(0, [2, 3]))
    segment = tmp_path / partition_dir(0) / entry.segment
    written = segment.read_bytes()
    manifest.write_bytes(kept)  # the crash: the segment landed, its entry did not
    assert verify(tmp_path).ok  # an unlisted segment is not part of the archive
    assert ArchiveWriter(tmp_path, TOPIC).append(0, run(0, [2, 3])) == entry
    assert segment.read_bytes() == written
    assert verify(tmp_path).ok


def test_a_writer_stopped_before_a_partitions_first_entry_leaves_nothing_archived(
    tmp_path: Path,
) -> None:
    ArchiveWriter(tmp_path, TOPIC)
    folder = tmp_path / partition_dir(5)
    folder.mkdir()
    assert verify(tmp_path).ok  # stopped after the folder
    (folder / "00000000000000000000-00000000000000000002.jsonl.gz").write_bytes(
        encode_segment(TOPIC, 5, 0, 2, run(5, [0, 1])))
    report = verify(tmp_path)  # stopped after the segment, before the manifest
    assert report.ok and report.partitions == 0, report.problems
    assert archived_end(tmp_path, 5) is None


def test_another_range_from_a_leftovers_start_removes_the_leftover(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    w.append(0, run(0, [0, 1]))
    manifest = tmp_path / partition_dir(0) / MANIFEST
    kept = manifest.read_bytes()
    leftover = w.append(0, run(0, [2, 3])).segment
    manifest.write_bytes(kept)  # stopped before the entry of [2, 4)
    entry = ArchiveWriter(tmp_path, TOPIC).append(0, run(0, [2, 3, 4, 5]))
    assert (entry.start, entry.end) == (2, 6)
    assert not (tmp_path / partition_dir(0) / leftover).exists()
    assert verify(tmp_path).ok


def test_segment_files_no_entry_lists_are_reported_unlisted(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    *_, third = (w.append(0, run(0, [i, i + 1])) for i in (0, 2, 4))
    manifest = tmp_path / partition_dir(0) / MANIFEST
    manifest.write_bytes(manifest.read_bytes().splitlines(keepends=True)[0])
    # the second could be a stopped writer's leftover at the archived end; the third not
    assert [(p.kind, p.segment) for p in verify(tmp_path).problems] == [
        ("unlisted", third.segment)]


@pytest.mark.parametrize(("offsets", "start", "end", "words"), [
    ([1, 2], 1, 3, "overlaps"),       # starts inside the first segment
    ([0, 1, 2, 3], 0, 4, "overlaps"),  # covers two segments as one
    ([4, 5], 3, 6, "gap"),            # leaves [2, 3) unarchived
    ([0, 1], 0, 2, "other records"),  # the archived range, other values
])
def test_an_overlapping_gapped_or_different_range_is_refused_and_nothing_written(
    tmp_path: Path, offsets: list[int], start: int, end: int, words: str
) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    w.append(0, run(0, [0, 1]))
    before = _files(tmp_path)
    records = [rec(0, o, b"other") for o in offsets]
    with pytest.raises(ArchiveRefused, match=rf"partition 0: .*\[{start}, {end}\).*{words}"):
        w.append(0, records, start=start, end=end)
    assert _files(tmp_path) == before


@pytest.mark.parametrize(("records", "start", "end", "words"), [
    ([], None, None, "no records"),
    ([rec(1, 0)], None, None, "a record of partition 1"),
    ([rec(0, 2), rec(0, 1)], None, None, "not increasing"),
    ([rec(0, 2)], 3, None, "outside the range"),
    ([rec(0, 2)], 0, 2, "outside the range"),
])
def test_records_that_do_not_fit_their_range_are_refused(
    tmp_path: Path, records: list[Record], start: int | None, end: int | None, words: str
) -> None:
    with pytest.raises(ArchiveRefused, match=words):
        ArchiveWriter(tmp_path, TOPIC).append(0, records, start=start, end=end)
    assert not (tmp_path / partition_dir(0)).exists()


# --- the reader --------------------------------------------------------------------------------


def test_the_reader_yields_in_order_from_a_position(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    w.append(3, run(3, [0, 1, 2]))
    w.append(3, run(3, [5, 6]), start=3)
    assert [r.offset for r in read_archive(tmp_path, 3)] == [0, 1, 2, 5, 6]
    assert [r.offset for r in read_archive(tmp_path, 3, start=2)] == [2, 5, 6]
    assert [r.offset for r in read_archive(tmp_path, 3, start=4)] == [5, 6]
    assert list(read_archive(tmp_path, 0)) == []


def test_the_reader_raises_on_an_altered_segment_naming_it(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path, TOPIC)
    w.append(0, run(0, [0, 1]))
    entry = w.append(0, run(0, [2, 3]))
    path = tmp_path / partition_dir(0) / entry.segment
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    reader = read_archive(tmp_path, 0)
    assert [next(reader).offset, next(reader).offset] == [0, 1]  # the intact one first
    with pytest.raises(SegmentError, match=rf"segment .*{entry.segment}: SHA-256"):
        next(reader)


def test_a_directory_without_an_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotAnArchive, match="no such directory"):
        verify(tmp_path / "absent")
    with pytest.raises(NotAnArchive, match="not an archive"):
        verify(tmp_path)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotAnArchive, match="not a directory"):
        verify(tmp_path / "file")


_bytes = st.binary(max_size=40) | st.text(max_size=20).map(lambda s: s.encode())


@given(key=st.none() | _bytes, value=_bytes,
       headers=st.lists(st.tuples(st.text(max_size=8), _bytes), max_size=3))
def test_a_segment_reads_back_the_records_it_was_made_of(
    key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]
) -> None:
    records = [Record(TOPIC, 2, 7, key, value, tuple(headers), 5), rec(2, 9)]
    data = encode_segment(TOPIC, 2, 6, 11, records)
    header, back = decode_segment(data)
    assert back == records and (header.start, header.end, header.count) == (6, 11, 2)
    assert encode_segment(TOPIC, 2, 6, 11, records) == data  # the same records, the same bytes


# --- any archive verifies; any damage is reported with its kind --------------------------------

# per partition, the runs appended: (marker positions before the run, records in it)
_runs = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), min_size=1, max_size=5)
_archive = st.dictionaries(st.integers(0, 3), _runs, min_size=1, max_size=3)


def _build(directory: Path, layout: dict[int, list[tuple[int, int]]]) -> list[Record]:
    w = ArchiveWriter(directory, TOPIC)
    out = []
    for partition, runs in layout.items():
        position = 0
        for skipped, count in runs:
            offsets = list(range(position + skipped, position + skipped + count))
            records = [rec(partition, o, headers=(("n", str(o).encode()),)) for o in offsets]
            w.append(partition, records, start=position)
            out.extend(records)
            position = offsets[-1] + 1
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=_archive)
def test_any_sequence_of_contiguous_appends_verifies_and_reads_back(
    layout: dict[int, list[tuple[int, int]]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        written = _build(directory, layout)
        report = verify(directory)
        assert report.ok, report.problems
        assert (report.partitions, report.segments, report.records) == (
            len(layout), sum(len(r) for r in layout.values()), len(written))
        back = [r for p in sorted(layout) for r in read_archive(directory, p)]
        assert sorted(map(_key, back)) == sorted(map(_key, written))


def _segment_paths(directory: Path, partition: int) -> list[Path]:
    lines = (directory / partition_dir(partition) / MANIFEST).read_bytes().splitlines()
    return [directory / partition_dir(partition) / orjson.loads(line)["segment"]
            for line in lines]


Damage = Callable[[Path, int, st.DataObject], tuple[list[set[str]], set[str]]]


def _delete_segment(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    segs = _segment_paths(d, p)
    i = data.draw(st.integers(0, len(segs) - 1))
    segs[i].unlink()
    return [{"missing"}], {segs[i].name}


def _swap_segments(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    segs = _segment_paths(d, p)
    i, j = data.draw(st.lists(st.integers(0, len(segs) - 1), min_size=2, max_size=2,
                              unique=True))
    a, b = segs[i].read_bytes(), segs[j].read_bytes()
    segs[i].write_bytes(b)
    segs[j].write_bytes(a)
    return [{"reordered"}], {segs[i].name, segs[j].name}


def _truncate_segment(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    segs = _segment_paths(d, p)
    i = data.draw(st.integers(0, len(segs) - 1))
    content = segs[i].read_bytes()
    segs[i].write_bytes(content[:data.draw(st.integers(0, len(content) - 1))])
    return [{"altered"}], {segs[i].name}


def _flip_segment(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    segs = _segment_paths(d, p)
    i = data.draw(st.integers(0, len(segs) - 1))
    content = bytearray(segs[i].read_bytes())
    content[data.draw(st.integers(0, len(content) - 1))] ^= data.draw(st.integers(1, 255))
    segs[i].write_bytes(bytes(content))
    return [{"altered"}], {segs[i].name}


def _lines(d: Path, p: int) -> tuple[Path, list[bytes]]:
    path = d / partition_dir(p) / MANIFEST
    return path, path.read_bytes().splitlines(keepends=True)


def _delete_line(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    # not the last: dropping a partition's newest entries is the live log's side of the
    # proof (docs/design.md §19)
    path, lines = _lines(d, p)
    i = data.draw(st.integers(0, len(lines) - 2))
    nxt = _segment_paths(d, p)[i + 1].name
    path.write_bytes(b"".join(lines[:i] + lines[i + 1:]))
    return ([{"chain"}, {"gap"}] if i else [{"chain"}]), {nxt}  # no gap before the first


def _swap_lines(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    path, lines = _lines(d, p)
    i, j = sorted(data.draw(st.lists(st.integers(0, len(lines) - 1), min_size=2, max_size=2,
                                     unique=True)))
    names = {s.name for s in _segment_paths(d, p)}
    lines[i], lines[j] = lines[j], lines[i]
    path.write_bytes(b"".join(lines))
    return [{"reordered"}], names


def _truncate_line(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    path, lines = _lines(d, p)
    i = data.draw(st.integers(0, len(lines) - 1))
    body = lines[i][:-1]
    lines[i] = body[:data.draw(st.integers(0, len(body) - 1))] + b"\n"
    path.write_bytes(b"".join(lines))
    return [{"malformed"}], {"-"}


def _flip_line(d: Path, p: int, data: st.DataObject) -> tuple[list[set[str]], set[str]]:
    path, lines = _lines(d, p)
    i = data.draw(st.integers(0, len(lines) - 1))
    names = {_segment_paths(d, p)[i].name, "-"}
    line = bytearray(lines[i])
    line[data.draw(st.integers(0, len(line) - 2))] ^= data.draw(st.integers(1, 255))
    lines[i] = bytes(line)
    path.write_bytes(b"".join(lines))
    try:  # a flipped file name is reported under the name the line now says
        names.add(str(orjson.loads(lines[i])["segment"]))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    # a line that no longer parses is malformed; one that does has a hash that fails
    return [{"malformed", "altered"}], names


DAMAGE: dict[str, tuple[Damage, int]] = {  # the damage, and the segments it needs
    "delete segment": (_delete_segment, 1),
    "swap segments": (_swap_segments, 2),
    "truncate segment": (_truncate_segment, 1),
    "flip a segment byte": (_flip_segment, 1),
    "delete a manifest line": (_delete_line, 2),
    "swap manifest lines": (_swap_lines, 2),
    "truncate a manifest line": (_truncate_line, 1),
    "flip a manifest byte": (_flip_line, 1),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=_archive, data=st.data())
def test_any_damage_is_reported_with_its_kind(
    damage: str, layout: dict[int, list[tuple[int, int]]], data: st.DataObject
) -> None:
    apply, needs = DAMAGE[damage]
    candidates = [p for p, runs in layout.items() if len(runs) >= needs]
    if not candidates:
        layout = {0: [(0, 1)] * needs}
        candidates = [0]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        _build(directory, layout)
        partition = data.draw(st.sampled_from(candidates))
        kinds, segments = apply(directory, partition, data)
        report = verify(directory)
        assert not report.ok
        here = [pr for pr in report.problems if pr.partition == partition]
        found = {pr.kind for pr in here}
        # each required kind (or one of its alternatives) is reported, at the damaged segments
        assert all(alternatives & found for alternatives in kinds), report.problems
        expected = set().union(*kinds)
        assert {pr.segment for pr in here if pr.kind in expected} <= segments | {"-"}
        # the other partitions are untouched and clean
        assert all(pr.partition == partition for pr in report.problems)
