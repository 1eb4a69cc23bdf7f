"""``chronolog archive verify`` end to end (a subprocess, ``.venv/bin/chronolog``): its exit
statuses and lines, the commands docs/deployment.md shows, and an archive writer killed with
kill -9 in the middle of its appends (docs/design.md §19)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from chronolog.archive import ArchiveWriter, archived_end, read_archive, verify
from chronolog.archive.store import read_entries
from chronolog.log.port import Record
from support.polling import wait_until_sync

from .conftest import CHRONOLOG, ROOT

TOPIC = "chronolog.events"


def _chronolog(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return subprocess.run([CHRONOLOG, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def _records(partition: int, offsets: range) -> list[Record]:
    return [Record(TOPIC, partition, o, f"acme/s{o % 7}".encode(), f'{{"n":{o}}}'.encode(),
                   (("processor", b"p1"),), 1_700_000_000_000 + o) for o in offsets]


def _archive(directory: Path) -> None:
    w = ArchiveWriter(directory, TOPIC)
    for p in (0, 2):
        for start in range(0, 30, 10):
            w.append(p, _records(p, range(start, start + 10)))


def test_a_clean_archive_exits_0_with_one_summary_line(tmp_path: Path) -> None:
    _archive(tmp_path)
    proc = _chronolog("archive", "verify", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "archive ok: 2 partitions, 6 segments, 60 records; 0 problems"]
    assert proc.stderr == ""


def test_each_problem_is_one_line_and_exits_1(tmp_path: Path) -> None:
    _archive(tmp_path)
    first, second, third = read_entries(tmp_path, 2)
    (tmp_path / "p0002" / first.segment).unlink()
    altered = tmp_path / "p0002" / third.segment
    altered.write_bytes(altered.read_bytes()[:-1])
    proc = _chronolog("archive", "verify", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == [
        f"PROBLEM missing: 2 {first.segment} segment file does not exist",
        f"PROBLEM altered: 2 {third.segment} SHA-256 "
        f"{_sha(altered)[:12]} is not the manifest's {third.sha256[:12]}",
    ]
    assert lines[2:] == [
        "archive FAILED: 2 problems (altered=1, missing=1) in 2 partitions, 6 segments, "
        "40 records"]
    assert second.segment not in proc.stdout


def test_swapped_manifest_lines_are_reported_reordered(tmp_path: Path) -> None:
    _archive(tmp_path)
    manifest = tmp_path / "p0000" / "manifest.jsonl"
    a, b, c = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(a + c + b)
    proc = _chronolog("archive", "verify", str(tmp_path), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["problem_counts"]["reordered"] == 1
    assert {(p["kind"], p["partition"]) for p in report["problems"]} >= {
        ("reordered", 0), ("chain", 0), ("gap", 0)}


def test_the_json_form_of_a_clean_archive(tmp_path: Path) -> None:
    _archive(tmp_path)
    proc = _chronolog("archive", "verify", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["problems"] == []
    assert (report["partitions"], report["segments"], report["records"]) == (2, 6, 60)
    assert set(report["problem_counts"].values()) == {0}


def test_bad_input_is_one_line_on_stderr_and_exits_2(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    proc = _chronolog("archive", "verify", str(absent))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [f"error: archive: '{absent}': "
                                        "no such directory"]
    proc = _chronolog("archive", "verify", str(tmp_path))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [
        f"error: archive: '{tmp_path}': not an archive (no valid ARCHIVE file)"]


def test_the_commands_of_the_deployment_guide_run(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text[text.index("**Archive.**"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    commands = [line.split("#")[0].split() for line in block.group(1).splitlines()
                if line.startswith("chronolog archive")]
    assert len(commands) == 2
    archive = tmp_path / "archive"
    _archive(archive)
    for argv in commands:
        proc = _chronolog(*[str(archive) if a == "/srv/chronolog/archive" else a
                            for a in argv[1:]])
        assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
    assert proc.stdout.startswith('{"ok": true')


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- kill -9 ------------------------------------------------------------------------------

# appends ranges [10 i, 10 i + 10) to partitions 0 and 1 in turn, from i = 0, forever: the
# same appends on every run
APPENDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from chronolog.archive import ArchiveWriter
    from chronolog.log.port import Record

    def records(p, start):
        return [Record("chronolog.events", p, o, f"acme/s{o % 7}".encode(),
                       (f'{{"n":{o},"p":{p}}}' * 20).encode(), (("processor", b"p1"),), o)
                for o in range(start, start + 10)]

    w = ArchiveWriter(Path(sys.argv[1]), "chronolog.events")
    i = 0
    while i < int(sys.argv[2]):
        for p in (0, 1):
            w.append(p, records(p, 10 * i))
        i += 1
""")


def _appender(directory: Path, ranges: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", APPENDER, str(directory), str(ranges)],
                            cwd=ROOT, stderr=subprocess.PIPE)


def test_a_writer_killed_with_kill_9_leaves_an_archive_that_verifies_and_resumes(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "archive"
    proc = _appender(directory, 1_000_000)
    try:
        wait_until_sync(lambda: (directory / "ARCHIVE").exists()
                   and (archived_end(directory, 1) or 0) >= 300, 60, what="300 archived")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    report = verify(directory)
    assert report.ok, report.problems
    ends = {p: archived_end(directory, p) or 0 for p in (0, 1)}
    assert all(end % 10 == 0 for end in ends.values())  # whole segments only
    listed = {p: {e.segment: _sha(directory / f"p{p:04d}" / e.segment)
                  for e in read_entries(directory, p)} for p in (0, 1)}

    # resumed: the same appends from the start, past where it was killed
    done = _appender(directory, max(ends.values()) // 10 + 5)
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err.decode()
    report = verify(directory)
    assert report.ok, report.problems
    for p in (0, 1):
        entries = read_entries(directory, p)
        # what was archived before the kill is byte for byte what is archived now
        assert {e.segment: _sha(directory / f"p{p:04d}" / e.segment)
                for e in entries[:len(listed[p])]} == listed[p]
        offsets = [r.offset for r in read_archive(directory, p)]
        assert offsets == list(range(archived_end(directory, p) or 0))  # no duplicate, no gap
        assert archived_end(directory, p) == 10 * (max(ends.values()) // 10 + 5)
        assert [r.value for r in read_archive(directory, p, start=0)][:1] == [
            (f'{{"n":0,"p":{p}}}' * 20).encode()]
