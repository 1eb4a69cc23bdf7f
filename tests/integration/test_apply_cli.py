"""``chronolog apply`` as a user runs it: real ``chronolog`` processes against a ``chronolog
dev`` node over its HTTP API (found through the data directory).

A directory of files is applied (a calendar and the schedules that name it are created, each
schedule labelled with its set); applied again, nothing changes — the dry run exits 0, and
no revision, no ``updatedAt`` and no offset of the read model's watermark (the events
projected) moves; a changed field shows as ``path: old -> new`` in the dry run (exit 1) and
is revised; ``--prune`` deletes the set's schedule that left the files and neither a schedule
made by hand nor another set's; an invalid document refuses the whole apply (exit 2, one line
naming the file, the document and the field) with nothing written. A concurrent edit between
the read and the write is a conflict, not a lost update (the transport, in this process).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from chronolog.cli.apply import APPLIED_BY, apply_plan, load_documents, make_plan, read_current
from chronolog.cli.http import HttpTransport
from chronolog.cli.transport import Target
from support.polling import wait_until

from .test_cli_http import DevNode, _node_file, nodes  # noqa: F401 - nodes: a fixture
from .test_ops_cli import Cli, Services, _env, _one_line, dsn  # noqa: F401 - dsn: a fixture

pytestmark = pytest.mark.postgres

AUTH = {"Authorization": "Bearer dev"}
CALENDARS = """\
kind: calendar
name: holidays
timezone: Europe/Paris
dates: [2026-12-25, 2027-01-01]
"""
JOBS = """\
kind: schedule
id: nightly
cron: "0 2 * * *"
timezone: Europe/Paris
job: {type: echo, params: {report: daily}}
retry: {maxAttempts: 5, initialBackoff: 30s}
exclude: [holidays]
---
kind: schedule
id: heartbeat
every: 15m
job: {type: echo}
"""
GONE = """\
kind = "schedule"
id = "gone"
at = 2031-01-01T09:00:00Z
[job]
type = "echo"
"""


async def _state(http: httpx.AsyncClient) -> tuple[dict[str, Any], dict[str, int]]:
    """Every schedule (ID -> (revision, updatedAt, labels)), and the watermark's offsets."""
    page = (await http.get("/v1/schedules", params={"limit": 500}, headers=AUTH)).json()
    return ({i["scheduleId"]: (i["revision"], i["updatedAt"],
                               i["definition"].get("labels", {})) for i in page["items"]},
            page["watermark"]["partitions"])


@pytest.mark.long(40)
async def test_apply_creates_then_changes_nothing_revises_prunes_and_refuses_bad_files(
    tmp_path: Path, dsn: str, nodes: list[DevNode],  # noqa: F811
) -> None:
    data_dir = tmp_path / ".chronolog"
    node = DevNode(data_dir, dsn, tmp_path / "dev.log")
    nodes.append(node)
    url = (await _node_file(data_dir, node))["url"]
    cli = Cli([], _env(), Services(tmp_path, _env()), cwd=tmp_path)
    files = tmp_path / "schedules"
    files.mkdir()
    (files / "calendars.yaml").write_text(CALENDARS)
    (files / "jobs.yaml").write_text(JOBS)
    (files / "later.toml").write_text(GONE)

    async with httpx.AsyncClient(base_url=url, timeout=30, headers=AUTH) as http:
        async def made(body: dict[str, Any]) -> bool:  # the processor may not own it yet
            r = await http.post("/v1/schedules", json=body,
                                headers={"Idempotency-Key": body["scheduleId"]})
            return r.status_code in (200, 201)

        # a schedule made by hand and one of another set: apply never touches them
        await wait_until(lambda: made({"scheduleId": "manual", "every": "1h",
                                       "job": {"type": "echo"}}), 60, what="manual created")
        await wait_until(lambda: made({"scheduleId": "theirs", "every": "1h",
                                       "job": {"type": "echo"},
                                       "labels": {APPLIED_BY: "other"}}), 60, what="theirs")

        r = await cli("apply", "-f", "schedules")
        assert r.rc == 0, r
        assert r.out.splitlines() == [
            "created calendar holidays (revision 1)", "created schedule nightly (revision 1)",
            "created schedule heartbeat (revision 1)", "created schedule gone (revision 1)",
            "applied (set default): 4 created, 0 revised, 0 deleted, 0 unchanged"]
        before, marks = await _state(http)
        assert before["nightly"][2] == {APPLIED_BY: "default"}
        assert before["theirs"][2] == {APPLIED_BY: "other"} and before["manual"][2] == {}

        # the same files again: nothing to do, nothing written
        r = await cli("apply", "-f", "schedules", "--dry-run")
        assert (r.rc, r.out.splitlines()) == (0, [
            "plan (set default): 0 to add, 0 to change, 0 to remove, 4 unchanged"]), r
        r = await cli("apply", "-f", str(files))
        assert r.rc == 0 and r.out.endswith("4 unchanged\n"), r
        assert await _state(http) == (before, marks)

        # one field changed, one schedule left the files: the plan, then the apply
        (files / "jobs.yaml").write_text(JOBS.replace("maxAttempts: 5", "maxAttempts: 7"))
        (files / "later.toml").unlink()
        r = await cli("apply", "-f", "schedules", "--prune", "--dry-run", "--json")
        assert r.rc == 1, r
        plan = json.loads(r.out)
        assert [(c["id"], c["action"], c.get("fields")) for c in plan["changes"]] == [
            ("nightly", "change", [{"path": "retry.maxAttempts", "old": 5, "new": 7}]),
            ("gone", "remove", None)]
        assert await _state(http) == (before, marks)  # a dry run sends nothing
        r = await cli("apply", "-f", "schedules", "--prune")
        assert r.rc == 0, r
        assert r.out.splitlines() == [
            "revised schedule nightly (revision 2)", "    retry.maxAttempts: 5 -> 7",
            "deleted schedule gone",
            "applied (set default): 0 created, 1 revised, 1 deleted, 2 unchanged"]
        after, marks = await _state(http)
        assert sorted(after) == ["heartbeat", "manual", "nightly", "theirs"]
        assert after["nightly"][0] == 2
        assert {k: after[k] for k in ("heartbeat", "manual", "theirs")} == {
            k: before[k] for k in ("heartbeat", "manual", "theirs")}

        # an invalid document anywhere: nothing of the files is sent
        (files / "jobs.yaml").write_text(JOBS.replace("maxAttempts: 5", "maxAttempts: 8") +
                                         "---\nkind: schedule\nid: new\nevery: 1h\n"
                                         "job: {type: echo}\nretry: {maxAttempts: 0}\n")
        r = await cli("apply", "-f", "schedules", "--prune")
        assert r.rc == 2 and r.out == "", r
        assert _one_line(r) == ("error: schedules/jobs.yaml, document 3: retry.maxAttempts: "
                                "'0': must be at least 1")
        assert await _state(http) == (after, marks)

        # a concurrent edit between the read and the write: a conflict, not a lost update
        (files / "jobs.yaml").write_text(JOBS.replace("maxAttempts: 5", "maxAttempts: 9"))
        docs = load_documents([str(files)], "default")
        async with HttpTransport(Target(url, "dev"), 30) as t:
            plan_ = make_plan(docs, await read_current(t, docs), "default", prune=True)
            assert [(c.key, c.revision) for c in plan_.changes] == [("nightly", 2)]
            edit = (await http.patch("/v1/schedules/nightly", json={"priority": 5},
                                     headers={"If-Match": "2"}))
            assert edit.status_code == 200, edit.text
            await apply_plan(t, plan_)
        (change,) = plan_.changes
        assert change.outcome == "refused" and change.error is not None
        assert change.error.status == "conflict", change.error
        shown = (await http.get("/v1/schedules/nightly")).json()
        assert shown["revision"] == 3 and shown["definition"]["priority"] == 5
        assert shown["definition"]["retry"]["maxAttempts"] == 7  # the edit was not lost
