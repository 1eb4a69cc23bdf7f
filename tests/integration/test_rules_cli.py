"""``chronolog rules snapshot`` / ``rules diff`` as subprocesses, on a real PostgreSQL read
model (schedules decided by the real decider and projected by the real store), with a
genuine tz database change: a zone database compiled with ``zic`` in which New York drops
daylight-saving time from 2027, read through ``PYTHONTZPATH``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chronolog.domain import messages as m
from chronolog.projections.project import project
from chronolog.settings import installed_rules
from support.tzdb import VERSION, compile_no_dst_new_york

from .decider_log import ScheduleLog
from .pgdb import create_database, drop_database, schema_store

pytestmark = pytest.mark.postgres

CHRONOLOG = Path(sys.executable).parent / "chronolog"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
WINDOW = "2027-03-01T00:00:00Z"  # 31 days: New York's DST start (2027-03-14) is inside
SPECS = {
    "ny-report": {"cron": "0 9 * * *", "timezone": "America/New_York"},
    "ny-quarter-hours": {"cron": "*/15 * * * *", "timezone": "America/New_York"},
    "utc-hourly": {"every": 3600.0},
    "paris-daily": {"cron": "30 6 * * *", "timezone": "Europe/Paris"},
    "after-each": {"delay": 600.0},
}


@pytest.fixture(scope="module")
def read_model(database_url: str) -> Iterator[str]:
    """A fresh database whose read model holds the schedules of SPECS (one paused)."""
    dsn = asyncio.run(create_database(database_url, "rules"))

    async def fill() -> None:
        store = await schema_store(dsn, "public")
        try:
            offset = 0
            for sid, rule in SPECS.items():
                sl = ScheduleLog("acme", sid)
                sl.do(m.CreateSchedule(spec=m.ScheduleSpec.model_validate(
                    {**rule, "job": {"type": "noop"}})), T0)
                if sid == "paris-daily":
                    sl.do(m.PauseSchedule(), T0 + timedelta(seconds=1))
                for env in sl.envelopes:
                    await store.apply(project(env), {("events", 0): (offset, offset + 1)},
                                      last_event_at={("events", 0): env.at})
                    offset += 1
        finally:
            await store.close()

    asyncio.run(fill())
    yield dsn
    asyncio.run(drop_database(database_url, dsn))


def _cli(*args: str, tzpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONTZPATH", None)
    if tzpath is not None:
        env["PYTHONTZPATH"] = str(tzpath)
    return subprocess.run([str(CHRONOLOG), *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture(scope="module")
def snapshot(read_model: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rules") / "snapshot.json"
    r = _cli("rules", "snapshot", "--database-url", read_model, "--from", WINDOW,
             "--days", "31", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_the_snapshot_names_engine_and_tzdata_and_holds_every_live_schedule(
    snapshot: Path,
) -> None:
    doc = json.loads(snapshot.read_text())
    installed = installed_rules()
    assert list(doc)[:5] == ["format", "formatVersion", "engine", "tzdata", "tzdataSource"]
    assert (doc["engine"], doc["tzdata"]) == (installed.engine, installed.tzdata)
    assert doc["tzdata"] not in ("", "unknown")
    assert (doc["from"], doc["to"]) == (WINDOW, "2027-04-01T00:00:00Z")
    by_id = {s["scheduleId"]: s for s in doc["schedules"]}
    assert set(by_id) == set(SPECS)  # the paused one included
    assert by_id["paris-daily"]["state"] == "PAUSED"
    ny = by_id["ny-report"]["instants"]
    assert len(ny) == 31 and all(i["local"][11:19] == "09:00:00" for i in ny)
    # 13:00Z once New York is on EDT (from 2027-03-14), 14:00Z before
    assert [i["utc"][11:13] for i in ny] == ["14"] * 13 + ["13"] * 18
    assert by_id["after-each"]["instants"] == []  # fixed delay: nothing to precompute
    assert [t["at"] for t in doc["zones"]["America/New_York"]] == ["2027-03-14T07:00:00Z"]


def test_diff_with_the_same_tz_database_changes_nothing(snapshot: Path) -> None:
    r = _cli("rules", "diff", str(snapshot))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "rules diff: none of 5 schedules would change"


def test_diff_under_a_tz_database_without_dst_lists_the_moved_instants(
    snapshot: Path, tmp_path: Path
) -> None:
    tz = compile_no_dst_new_york(tmp_path)
    r = _cli("rules", "diff", str(snapshot), "--json", tzpath=tz)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["installed"]["tzdata"] == VERSION
    assert report["snapshot"]["tzdata"] == json.loads(snapshot.read_text())["tzdata"]
    changed = {c["scheduleId"]: c for c in report["changed"]}
    assert set(changed) == {"ny-report"}  # UTC, Paris and the quarter hours unaffected
    ny = changed["ny-report"]
    gone = {"at": "2027-03-14T07:00:00Z", "before": "-05:00", "after": "-04:00", "dst": True}
    assert ny["transitionsRemoved"] == [gone] and ny["transitionsAdded"] == []
    recorded = [i for s in json.loads(snapshot.read_text())["schedules"]
                if s["scheduleId"] == "ny-report" for i in s["instants"]]
    on_edt = [i for i in recorded if i["utc"] >= gone["at"]]
    assert (ny["moved"], ny["added"], ny["removed"]) == (len(on_edt), 0, 0)
    for change, before in zip(ny["changes"], on_edt, strict=True):
        assert change["change"] == "moved" and change["before"] == before
        moved = datetime.fromisoformat(before["utc"].replace("Z", "+00:00")) + timedelta(hours=1)
        assert change["after"]["utc"] == moved.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert change["after"]["local"] == before["local"][:19] + "-05:00"
        assert change["transition"] == gone
    # the wildcard job runs on real elapsed time: every quarter hour UTC matches on either
    # offset, so none of its instants moves (only their local times do)
    # the text form says the same
    text = _cli("rules", "diff", str(snapshot), tzpath=tz)
    assert text.returncode == 1
    assert "CHANGED acme/ny-report (America/New_York): 18 moved, 0 added, 0 removed" in text.stdout
    assert ("transition gone: America/New_York 2027-03-14T07:00:00Z -05:00 -> -04:00 "
            "(DST starts)") in text.stdout
    assert text.stdout.strip().splitlines()[-1] == "rules diff: 1 of 5 schedules would change"


def test_diff_against_an_older_engine_s_instants_names_no_transition(
    snapshot: Path, tmp_path: Path
) -> None:
    doc = json.loads(snapshot.read_text())
    utc = next(s for s in doc["schedules"] if s["scheduleId"] == "utc-hourly")
    dropped = utc["instants"].pop(3)  # as if the older engine had not fired then
    path = tmp_path / "older.json"
    path.write_text(json.dumps(doc))
    r = _cli("rules", "diff", str(path), "--json")
    assert r.returncode == 1
    [c] = json.loads(r.stdout)["changed"]
    assert c["scheduleId"] == "utc-hourly" and (c["added"], c["moved"], c["removed"]) == (1, 0, 0)
    assert c["changes"][0]["after"] == dropped and c["changes"][0]["transition"] is None


@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot read it"),
    ("{not json", "not JSON"),
    ('{"format": "something-else"}', "not a chronolog rules snapshot"),
    ("SNAPSHOT-WITHOUT-ENGINE", "field engine: Field required"),
    ("SNAPSHOT-BAD-INSTANT", "field schedules.1.instants.0.utc"),
    ("SNAPSHOT-BAD-LOCAL", "field schedules.1.instants.2.local: Value error, not an instant"),
    ("SNAPSHOT-BAD-FROM", "field from: not an instant"),
])
def test_a_bad_snapshot_exits_2_with_one_line_naming_the_problem(
    snapshot: Path, tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "bad.json"
    doc = json.loads(snapshot.read_text())
    if content == "SNAPSHOT-WITHOUT-ENGINE":
        del doc["engine"]
        content = json.dumps(doc)
    elif content == "SNAPSHOT-BAD-INSTANT":
        doc["schedules"][1]["instants"][0]["utc"] = 5
        content = json.dumps(doc)
    elif content == "SNAPSHOT-BAD-LOCAL":
        doc["schedules"][1]["instants"][2]["local"] = "09:00"
        content = json.dumps(doc)
    elif content == "SNAPSHOT-BAD-FROM":
        doc["from"] = "yesterday"
        content = json.dumps(doc)
    if content is not None:
        path.write_text(content)
    r = _cli("rules", "diff", str(path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: snapshot: '{path}'"), r.stderr
    assert problem in lines[0]
    assert r.stdout == ""


def test_snapshot_bad_flags_exit_2(read_model: str, tmp_path: Path) -> None:
    r = _cli("rules", "snapshot", "--database-url", read_model, "--days", "0")
    assert r.returncode == 2 and r.stderr == "error: --days: '0': expected a whole number 1..366\n"
    r = _cli("rules", "snapshot", "--database-url", read_model, "--from", "soon")
    assert r.returncode == 2 and "error: --from: 'soon'" in r.stderr
    r = _cli("rules", "snapshot", "--database-url", read_model, "--out",
             str(tmp_path / "no" / "such" / "dir.json"))
    assert r.returncode == 2 and "error: --out: " in r.stderr
