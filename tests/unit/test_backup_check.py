"""The checks of a backup that need no database, as invariants (Hypothesis): a binary COPY
file parses to its row count and every cut of it is refused; any changed byte of a manifest
is refused, naming the manifest."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from chronolog.cli.backup_check import FORMAT, FORMAT_VERSION, manifest_checksum, verify
from chronolog.cli.errors import UsageError
from chronolog.projections.backup import BackupMismatch, copy_rows

fields = st.one_of(st.none(), st.binary(max_size=20))
rows_st = st.lists(st.lists(fields, min_size=1, max_size=4), max_size=6)


def _copy_file(rows: list[list[bytes | None]]) -> bytes:
    """A binary COPY file as PostgreSQL writes it (signature, flags, no header extension)."""
    out = bytearray(b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0))
    for row in rows:
        out += struct.pack("!h", len(row))
        for value in row:
            out += struct.pack("!i", -1) if value is None else \
                struct.pack("!i", len(value)) + value
    return bytes(out + struct.pack("!h", -1))


@given(rows_st, st.data())
@settings(max_examples=60, deadline=None)
def test_a_copy_file_parses_to_its_rows_and_every_cut_of_it_is_refused(
    rows: list[list[bytes | None]], data: st.DataObject,
) -> None:
    whole = _copy_file(rows)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.copy"
        path.write_bytes(whole)
        assert copy_rows(path) == len(rows)
        cut = data.draw(st.integers(0, len(whole) - 1))
        path.write_bytes(whole[:cut])
        with pytest.raises(BackupMismatch):
            copy_rows(path)
        path.write_bytes(whole + b"\x00")
        with pytest.raises(BackupMismatch, match="after its COPY trailer"):
            copy_rows(path)


def _manifest() -> str:
    doc = {"format": FORMAT, "formatVersion": FORMAT_VERSION, "createdAt": "2026-12-04T09:00Z",
           "log": {"kind": "sqlite", "file": "log.db", "prefix": "chronolog.",
                   "records": {"chronolog.events": 6}},
           "readModel": {"folder": "readmodel", "tables": {"runs": 3}, "migrations": [1, 2]},
           "results": None,
           "files": {"log.db": {"bytes": 4096, "sha256": "ab" * 32}}}
    doc["manifestSha256"] = manifest_checksum(doc)
    return json.dumps(doc, indent=1) + "\n"


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_any_changed_byte_of_the_manifest_is_refused_naming_it(data: st.DataObject) -> None:
    text = _manifest().encode()
    at = data.draw(st.integers(0, len(text) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != text[at]))
    changed = text[:at] + bytes([byte]) + text[at + 1:]
    try:
        same = json.loads(changed) == json.loads(text)
    except ValueError:
        same = False
    assume(not same)  # a changed blank between tokens changes nothing
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "manifest.json").write_bytes(changed)
        with pytest.raises(UsageError, match=r"manifest\.json"):
            verify(Path(d))


def test_an_unchanged_manifest_passes_its_own_check() -> None:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "manifest.json").write_text(_manifest())
        with pytest.raises(UsageError, match=r"readmodel/runs\.copy is not listed"):  # next check
            verify(Path(d))
