"""``chronolog audit`` end to end: events appended to a real SQLite log file, the CLI run as a
subprocess (``.venv/bin/chronolog``), its exit status and output checked.

The clean log is produced by the real decider (create, tick, claim, heartbeat, complete,
fail and retry) on three schedules spread over the partitions by their keys; broken logs
are the clean one plus a hand-made event that breaks one rule.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chronolog.audit.folds import CHECKPOINT_VERSION, LINES_VERSION
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.audit_checkpoints import load_checkpoint, save_checkpoint
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog

from .decider_log import ScheduleLog

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TENANT = "acme"
PARTITIONS = 3
CHRONOLOG = Path(sys.executable).parent / "chronolog"


def _clean_events(schedule_id: str) -> list[m.EventEnvelope]:
    """One schedule through the real decider: two runs, a retry, a heartbeat."""
    sl = ScheduleLog(TENANT, schedule_id)

    def complete(c: m.AttemptClaimed, now: datetime) -> None:
        sl.do(m.CompleteRun(run_id=c.run_id, attempt=c.attempt, fence=c.fence, worker_id="w1",
                            checksum="sha256:ab", size=2), now)

    sl.do(m.CreateSchedule(spec=m.ScheduleSpec(every=60.0, job=m.JobSpec(type="report"),
                                               misfire="all", lease=30.0)), T0)
    run1 = sl.materialized(sl.do(m.Tick(), T0))
    c = sl.claim(run1, T0 + timedelta(seconds=1))
    sl.do(m.Heartbeat(run_id=run1, attempt=c.attempt, fence=c.fence, worker_id="w1"),
          T0 + timedelta(seconds=10))
    complete(c, T0 + timedelta(seconds=20))
    run2 = sl.materialized(sl.do(m.Tick(), T0 + timedelta(seconds=60)))
    c = sl.claim(run2, T0 + timedelta(seconds=61))
    sl.do(m.FailRun(run_id=run2, attempt=c.attempt, fence=c.fence, worker_id="w1"),
          T0 + timedelta(seconds=62))
    retry_at = sl.state.run(run2).retry_at  # type: ignore[union-attr]
    assert retry_at is not None
    sl.do(m.Tick(), retry_at)
    complete(sl.claim(run2, retry_at), retry_at + timedelta(seconds=1))
    sl.do(m.Tick(), T0 + timedelta(seconds=300))  # misfire all: 120, 180, 240, 300 (+ overlap)
    return sl.envelopes


def _write_log(path: Path, envelopes: list[m.EventEnvelope], extra: list[bytes] = ()) -> None:  # type: ignore[assignment]
    async def main() -> None:
        log = SqliteEventLog(str(path), Topics(partitions=PARTITIONS), synchronous="NORMAL")
        await log.start()
        await log.ensure_topics()
        await log.append([OutRecord(topic=log.topics.events, key=e.key.encode(),
                                    value=codec.encode_event(e)) for e in envelopes])
        if extra:
            await log.append([OutRecord(topic=log.topics.events, key=b"acme/junk", value=v)
                              for v in extra])
        await log.close()

    asyncio.run(main())


def _chronolog(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return subprocess.run([str(CHRONOLOG), *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture
def clean() -> list[m.EventEnvelope]:
    return [e for sid in ("nightly", "hourly", "reports-eu") for e in _clean_events(sid)]


def test_a_clean_log_exits_0_with_a_summary(tmp_path: Path, clean: list[m.EventEnvelope]) -> None:
    db = tmp_path / "log.db"
    _write_log(db, clean)
    proc = _chronolog("audit", "--log", f"sqlite:///{db}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines == [f"audit ok: {len(clean)} events, 3 schedules, "
                     f"{sum(e.type == 'OccurrenceMaterialized' for e in clean)} runs, "
                     f"{sum(e.type == 'ResultPublished' for e in clean)} results, "
                     "0 effects; 0 violations"]
    # the three schedules landed on more than one partition, and all were read
    assert len({partition_for(e.key.encode(), PARTITIONS) for e in clean}) > 1
    assert proc.stderr == ""


def test_the_data_dir_and_json_forms(tmp_path: Path, clean: list[m.EventEnvelope]) -> None:
    _write_log(tmp_path / "log.db", clean)
    proc = _chronolog("audit", "--data-dir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["events"] == len(clean)
    assert set(report["violation_counts"].values()) == {0}


def test_a_broken_log_exits_1_and_prints_the_violation_with_its_events(
    tmp_path: Path, clean: list[m.EventEnvelope]
) -> None:
    first = next(e for e in clean if e.type == "ResultPublished")
    again = first.model_copy(update={"event_id": "forged.0"})
    db = tmp_path / "log.db"
    _write_log(db, clean + [again])
    proc = _chronolog("audit", "--log", f"sqlite:///{db}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    (head,) = [i for i, line in enumerate(out) if line.startswith("VIOLATION")]
    assert out[head].startswith("VIOLATION result_once: a second ResultPublished for run ")
    assert f"[acme/{first.schedule_id} run {first.payload.run_id}]" in out[head]  # type: ignore[union-attr]
    events = out[head + 1: head + 3]
    assert events[0].strip().endswith(f"ResultPublished {first.event_id}")
    assert events[1].strip().endswith("ResultPublished forged.0")
    assert all(line.startswith("    p") and "@" in line for line in events)
    assert out[-1].startswith("audit FAILED: 1 violations (result_once=1)")


def test_an_undecodable_record_is_reported(tmp_path: Path, clean: list[m.EventEnvelope]) -> None:
    db = tmp_path / "log.db"
    _write_log(db, clean, extra=[b"{not json"])
    proc = _chronolog("audit", "--log", f"sqlite:///{db}", "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["violation_counts"]["decodable"] == 1


@pytest.mark.parametrize("args, fragment", [
    (["--log", "postgres://x"], "error: CHRONOLOG_LOG: 'postgres://x'"),
    (["--log", "sqlite://"], "no file path"),
    (["--log", "kafka://nohost"], "is not host:port"),
    (["--partitions", "0"], "error: --partitions: '0'"),
])
def test_a_bad_log_value_exits_2_with_one_line(args: list[str], fragment: str) -> None:
    proc = _chronolog("audit", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr


def test_a_missing_log_file_exits_2_and_is_not_created(tmp_path: Path) -> None:
    db = tmp_path / "nope" / "log.db"
    proc = _chronolog("audit", "--log", f"sqlite:///{db}")
    assert proc.returncode == 2
    assert "no such file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not db.exists()


def test_a_log_without_the_events_topic_exits_2(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    _write_log(db, [])
    env_prefix = _chronolog("audit", "--log", f"sqlite:///{db}")
    assert env_prefix.returncode == 0  # topics exist, no events: a clean, empty log
    assert "audit ok: 0 events" in env_prefix.stdout
    proc = subprocess.run(
        [str(CHRONOLOG), "audit", "--log", f"sqlite:///{db}"], capture_output=True, text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")},
             "CHRONOLOG_TOPIC_PREFIX": "other."}, timeout=120)
    assert proc.returncode == 2
    assert "no topic 'other.events'" in proc.stderr


# -- checkpoints: an audit goes on from where the last one stopped


def _audit_records(db: Path) -> list[tuple[bytes | None, bytes]]:
    async def main() -> list[tuple[bytes | None, bytes]]:
        log = SqliteEventLog(str(db), Topics(partitions=PARTITIONS))
        await log.start()
        try:
            return [(r.key, r.value) for r in await log.read(log.topics.audit, 0, 0, 1000)]
        finally:
            await log.close()

    return asyncio.run(main())


def _append_audit(db: Path, records: list[tuple[bytes | None, bytes]]) -> None:
    async def main() -> None:
        log = SqliteEventLog(str(db), Topics(partitions=PARTITIONS))
        await log.start()
        await log.append([OutRecord(log.topics.audit, k, v, partition=0) for k, v in records])
        await log.close()

    asyncio.run(main())


def test_a_second_audit_reads_only_what_is_new_and_full_gives_the_same_verdict(
    tmp_path: Path, clean: list[m.EventEnvelope],
) -> None:
    db = tmp_path / "log.db"
    _write_log(db, clean)
    first = _chronolog("audit", "--log", f"sqlite:///{db}")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "went on from" not in first.stdout
    assert any(k == b"head" for k, _ in _audit_records(db))  # the checkpoint it left

    again = next(e for e in clean if e.type == "ResultPublished").model_copy(
        update={"event_id": "forged.0"})
    _write_log(db, [again])
    second = _chronolog("audit", "--log", f"sqlite:///{db}")
    assert second.returncode == 1, second.stdout + second.stderr
    assert "VIOLATION result_once: a second ResultPublished" in second.stdout
    assert f"({len(clean)} events): 1 events read since" in second.stdout
    assert second.stdout.splitlines()[-1].startswith(
        f"audit FAILED: 1 violations (result_once=1) in {len(clean) + 1} events")

    full = _chronolog("audit", "--log", f"sqlite:///{db}", "--full", "--json")
    resumed = _chronolog("audit", "--log", f"sqlite:///{db}", "--json")
    a, b = json.loads(full.stdout), json.loads(resumed.stdout)
    assert full.returncode == resumed.returncode == 1
    assert {k: v for k, v in a.items() if k != "notes"} == {
        k: v for k, v in b.items() if k != "notes"}
    assert any("0 events read since" in n for n in b["notes"])


def test_a_checkpoint_of_another_log_or_a_damaged_one_is_not_used(
    tmp_path: Path, clean: list[m.EventEnvelope],
) -> None:
    a, b = tmp_path / "a" / "log.db", tmp_path / "b" / "log.db"
    a.parent.mkdir()
    b.parent.mkdir()
    _write_log(a, clean)
    _write_log(b, [e for e in clean if e.schedule_id == "nightly"])
    assert _chronolog("audit", "--log", f"sqlite:///{a}").returncode == 0
    _append_audit(b, _audit_records(a))  # a's checkpoint, on b's log
    other = _chronolog("audit", "--log", f"sqlite:///{b}", "--no-save")
    assert other.returncode == 0, other.stdout + other.stderr
    assert "audited from the beginning" in other.stdout
    nightly = sum(e.schedule_id == "nightly" for e in clean)
    assert f"audit ok: {nightly} events, 1 schedules" in other.stdout

    # a's own checkpoint with a chunk overwritten: reported, and the log audited whole
    _append_audit(a, [(b"a/0", b"not the chunk")])
    damaged = _chronolog("audit", "--log", f"sqlite:///{a}")
    assert damaged.returncode == 0, damaged.stdout + damaged.stderr
    assert "do not match their head" in damaged.stdout
    assert f"audit ok: {len(clean)} events" in damaged.stdout
    # it saved a new checkpoint (in the other slot): the next audit goes on from it
    assert "0 events read since" in _chronolog("audit", "--log", f"sqlite:///{a}").stdout


def test_a_checkpoint_of_an_older_version_is_not_used_and_replaced(
    tmp_path: Path, clean: list[m.EventEnvelope],
) -> None:
    db = tmp_path / "log.db"
    _write_log(db, clean)
    assert _chronolog("audit", "--log", f"sqlite:///{db}").returncode == 0

    async def downgrade() -> None:  # the same checkpoint, as a version before this one
        log = SqliteEventLog(str(db), Topics(partitions=PARTITIONS))
        await log.start()
        try:
            saved = await load_checkpoint(log)
            assert saved is not None
            first, _, rest = saved.document.partition(b"\n")  # JSON lines: the head first
            doc = json.loads(first)
            assert doc["version"] == LINES_VERSION
            doc["version"] = CHECKPOINT_VERSION - 1
            await save_checkpoint(log, dataclasses.replace(
                saved, document=json.dumps(doc).encode() + b"\n" + rest))
        finally:
            await log.close()

    asyncio.run(downgrade())
    old = _chronolog("audit", "--log", f"sqlite:///{db}")
    assert old.returncode == 0, old.stdout + old.stderr
    assert (f"is unusable (audit checkpoint version {CHECKPOINT_VERSION - 1} (this chronolog "
            f"reads {CHECKPOINT_VERSION} and {LINES_VERSION})): audited from the beginning"
            ) in old.stdout
    assert f"audit ok: {len(clean)} events" in old.stdout
    # it saved a checkpoint of its own version: the next audit goes on from it
    assert "0 events read since" in _chronolog("audit", "--log", f"sqlite:///{db}").stdout


def test_no_save_leaves_no_checkpoint(tmp_path: Path, clean: list[m.EventEnvelope]) -> None:
    db = tmp_path / "log.db"
    _write_log(db, clean)
    assert _chronolog("audit", "--log", f"sqlite:///{db}", "--no-save").returncode == 0
    assert _audit_records(db) == []


# -- the history from an archive: below each partition's archived end the audit reads it


def _archive(db: Path, directory: Path, replace: dict[str, bytes] | None = None) -> int:
    """Archive the first half of every partition of the log's events (a record whose event
    ID is in ``replace`` archived with that value instead); the records archived."""
    from chronolog.archive import ArchiveWriter

    async def main() -> int:
        log = SqliteEventLog(str(db), Topics(partitions=PARTITIONS))
        await log.start()
        writer = ArchiveWriter(directory, log.topics.events)
        n = 0
        try:
            for p in range(PARTITIONS):
                records = await log.read(log.topics.events, p, 0, 1000)
                half = records[: len(records) // 2]
                if not half:
                    continue
                swapped = []
                for r in half:
                    event_id = codec.decode_event(r.value).event_id
                    value = (replace or {}).get(event_id, r.value)
                    swapped.append(dataclasses.replace(r, value=value))
                writer.append(p, swapped)
                n += len(half)
        finally:
            await log.close()
        return n

    return asyncio.run(main())


def test_the_history_below_the_archived_end_is_read_from_the_archive(
    tmp_path: Path, clean: list[m.EventEnvelope],
) -> None:
    db, archive = tmp_path / "log.db", tmp_path / "archive"
    _write_log(db, clean)
    assert _archive(db, archive) > 0
    archived = _archived(archive)
    same = _chronolog("audit", "--log", f"sqlite:///{db}", "--full", "--no-save",
                      "--archive", str(archive))
    assert same.returncode == 0, same.stdout
    assert same.stdout.splitlines()[-1].startswith(f"audit ok: {len(clean)} events")  # once each

    # an archive whose copy of an event says otherwise than the log: the archive is what is
    # read below its end (here the copy of the event after a result is a second result)
    p, results = next((p, [e for e in envs if e.type == "ResultPublished"])
                      for p, envs in archived.items()
                      if any(e.type == "ResultPublished" for e in envs))
    later = archived[p][archived[p].index(results[0]) + 1]
    forged = results[0].model_copy(update={"event_id": later.event_id})
    other = tmp_path / "forged"
    _archive(db, other, {later.event_id: codec.encode_event(forged)})
    live = _chronolog("audit", "--log", f"sqlite:///{db}", "--full", "--no-save")
    assert live.returncode == 0, live.stdout
    read = _chronolog("audit", "--log", f"sqlite:///{db}", "--full", "--no-save",
                      "--archive", str(other))
    assert read.returncode == 1, read.stdout
    assert "VIOLATION result_once: a second ResultPublished" in read.stdout


def _archived(archive: Path) -> dict[int, list[m.EventEnvelope]]:
    from chronolog.archive import read_archive

    return {p: [codec.decode_event(r.value) for r in read_archive(archive, p)]
            for p in range(PARTITIONS) if (archive / f"p{p:04d}").is_dir()}


def test_a_damaged_archive_is_a_violation_and_leaves_no_checkpoint(
    tmp_path: Path, clean: list[m.EventEnvelope],
) -> None:
    db, archive = tmp_path / "log.db", tmp_path / "archive"
    _write_log(db, clean)
    _archive(db, archive)
    segment = sorted(archive.glob("p*/*.gz"))[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    proc = _chronolog("audit", "--log", f"sqlite:///{db}", "--archive", str(archive))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "VIOLATION archive_intact:" in proc.stdout and segment.name in proc.stdout
    assert _audit_records(db) == []  # nothing proved, nothing saved


def test_an_archive_that_is_not_one_exits_2(tmp_path: Path, clean: list[m.EventEnvelope]) -> None:
    db = tmp_path / "log.db"
    _write_log(db, clean)
    proc = _chronolog("audit", "--log", f"sqlite:///{db}", "--archive", str(tmp_path / "none"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --archive: '") and len(proc.stderr.splitlines()) == 1
