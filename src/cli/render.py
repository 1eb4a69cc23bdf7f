"""The text output of the user commands (``schedule``, ``trigger``, ``cancel``, ``redrive``,
``runs``, ``run``, ``workers list``): rich tables and one-line confirmations, made from the
HTTP API's documents whichever way a command went (``--json`` prints the documents
themselves)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported when a table is printed: a --json call never loads it
    from rich.console import Console
    from rich.table import Table

__all__ = ["created", "excluded_text", "exclusion_text", "revised", "run", "run_written",
           "runs", "schedule", "schedules", "short", "state_changed", "state_text",
           "triggered", "workers"]


def short(text: str, n: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= n else text[: n - 3] + "..."


def _console() -> Console:
    from rich.console import Console

    # a pipe gets wide lines rather than rich's 80-column default
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _t(value: str | None) -> str:
    """A UTC time for people: whole seconds (``2026-11-29T10:37:28Z``)."""
    if not value:
        return "-"
    return value.split(".", 1)[0].removesuffix("Z") + "Z"


def _table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r])
    return table


def _kv(pairs: list[tuple[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(show_header=False, show_edge=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in pairs:
        table.add_row(k, "-" if v is None or v == "" else str(v))
    return table


def _rule_text(d: dict[str, Any]) -> str:
    if "cron" in d:
        return f"cron '{d['cron']}' {d.get('timezone', 'UTC')}"
    if "every" in d:
        return f"every {d['every']:g}s" + (f" anchor {d['anchor']}" if d.get("anchor") else "")
    if "at" in d:
        return f"at {d['at']}"
    if "delay" in d:
        return f"delay {d['delay']:g}s"
    return "-"


def _policy_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("policy"))
    return None if value is None else str(value)


def _more(con: Console, doc: dict[str, Any]) -> None:
    if doc.get("nextCursor"):
        con.print(f"more: --after {doc['nextCursor']}", soft_wrap=True)


# =======================================================================================
# writes


def created(result: dict[str, Any]) -> None:
    print(f"created schedule {result['scheduleId']} (revision {result['revision']}); "
          f"next run {result['nextRunAt'] or '-'}")


def revised(schedule_id: str, result: dict[str, Any]) -> None:
    print(f"revised schedule {schedule_id} (revision {result['revision']}); "
          f"next run {result['nextRunAt'] or '-'}")


def state_changed(action: str, result: dict[str, Any]) -> None:
    done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[action]
    nxt = (f"; next run {result['nextRunAt']}"
           if result["state"] == "ACTIVE" and result["nextRunAt"] else "")
    print(f"{done} schedule {result['scheduleId']}: {result['state']} (revision "
          f"{result['revision']}){nxt}")


def triggered(schedule_id: str, result: dict[str, Any]) -> None:
    state = result["state"] or f"finished (chronolog run {result['runId']} tells how)"
    print(f"triggered run {result['runId']} of {schedule_id}: {state}")


def backfilled(schedule_id: str, result: dict[str, Any]) -> None:
    """A backfill's answer: what it ran, what it did not and why."""
    if result["repeated"]:
        print(f"backfill {result['backfillId']} of {schedule_id} was made before: "
              f"{result['runs']} run(s) of {result['instants']} instant(s) in "
              f"[{result['from']}, {result['to']})")
        return
    print(f"backfilled {schedule_id}: {result['runs']} run(s) of {result['instants']} "
          f"instant(s) in [{result['from']}, {result['to']}) ({result['overlap']})")
    items = result["items"]
    if items:
        _console().print(_table(None, ["scheduledAt", "runId", "not run"], [
            [_t(i["scheduledAt"]), i.get("runId") or "-", i.get("reason") or ""]
            for i in items]))


def run_written(command: str, run_id: str, result: dict[str, Any]) -> None:
    if command == "cancel":
        text = ("cancellation requested (the run is executing)"
                if result.get("outcome") == "requested" else "cancelled")
    else:
        text = f"redriven: {result['state']} (attempt {result.get('attempt')})"
    print(f"run {run_id}: {text}")


# =======================================================================================
# reads


def schedule(doc: dict[str, Any]) -> None:
    d = doc["definition"]
    con = _console()
    con.print(_kv([
        ("schedule", doc["scheduleId"]), ("state", doc["state"]),
        ("revision", doc["revision"]), ("rule", _rule_text(d)),
        ("job", f"{d['job']['type']} {json.dumps(d['job'].get('params') or {})}"),
        ("misfire", _policy_text(d.get("misfire"))), ("overlap", d.get("overlap")),
        ("retry", json.dumps(d.get("retry")) if d.get("retry") else None),
        ("lease", d.get("lease")), ("startDeadline", d.get("startDeadline")),
        ("jitter", d.get("jitter")), ("nextRunAt", _t(doc["nextRunAt"])),
        ("created / updated", f"{_t(doc['createdAt'])} / {_t(doc['updatedAt'])}"),
    ] + ([("labels", " ".join(f"{k}={v}" for k, v in d["labels"].items()))]
         if d.get("labels") else [])
      + ([("paused", f"{_t(doc['pausedAt'])} {doc['pauseReason'] or ''}".strip())]
         if doc.get("pausedAt") else [])
      + ([("completed", f"{_t(doc['completedAt'])} ({doc['completedReason']})")]
         if doc.get("completedAt") else [])))
    if doc.get("resume") is not None and doc["resume"]["instants"]:
        con.print(_table("a resume now would", ["scheduledAt", "through", "count", "action"],
                         [[_t(i["scheduledAt"]), _t(i["through"]) if i["through"] else "",
                           i["count"], i["action"] + (f" ({i['reason']})" if i["reason"]
                                                      else "")]
                          for i in doc["resume"]["instants"]]))
    if doc.get("preview"):
        marked = any(p.get("excluded") for p in doc["preview"])
        con.print(_table("next instants", ["#", "scheduledAt", "dueAt", "local",
                                           *(["excluded"] if marked else [])],
                         [[i, _t(p["scheduledAt"]), _t(p["dueAt"]), p["local"],
                           *([excluded_text(p.get("excluded"))] if marked else [])]
                          for i, p in enumerate(doc["preview"], 1)]))
    else:
        con.print(f"no upcoming instants ({doc['state']})")


def schedules(doc: dict[str, Any], states: str | None) -> None:
    items = doc["items"]
    con = _console()
    if not items:
        con.print("no schedules" + (f" in state {states}" if states else ""))
    else:
        con.print(_table(None, ["schedule", "state", "rev", "rule", "job", "nextRunAt"],
                         [[i["scheduleId"], i["state"], i["revision"],
                           _rule_text(i["definition"]), i["definition"]["job"]["type"],
                           _t(i["nextRunAt"])] for i in items]))
    _more(con, doc)


def runs(doc: dict[str, Any], schedule_id: str | None, states: str | None) -> None:
    items: list[dict[str, Any]] = doc["items"]
    con = _console()
    if not items:
        con.print(f"no runs{f' of {schedule_id}' if schedule_id else ''}"
                  + (f" in state {states}" if states else ""))
    else:
        waits = any(i.get("waiting") for i in items)
        across = any("jobType" in i for i in items)  # the list across schedules
        con.print(_table(None, ["runId", *(["schedule", "job"] if across else []),
                                "scheduledAt", "state", "attempt", "startedAt", "finishedAt",
                                *(["waiting"] if waits else [])],
                         [[i["runId"], *([i["scheduleId"], i.get("jobType")] if across else []),
                           _t(i["scheduledAt"]), state_text(i), i["attempt"],
                           _t(i["startedAt"]), _t(i["finishedAt"]),
                           *([i.get("waiting") or ""] if waits else [])]
                          for i in items]))
    _more(con, doc)


def _job(job_type: str | None, params: Any) -> str | None:
    """A run's job: its type and parameters (``-`` for none); None (the line is left out)
    for a run that never started and so has neither, as a skipped one."""
    if job_type is None and params is None:
        return None
    return f"{job_type or '-'} {'-' if params is None else json.dumps(params)}"


def excluded_text(mark: dict[str, Any] | None) -> str:
    """An upcoming instant's ``excluded`` mark: ``by calendar 'us-holidays': 2026-12-25``
    ("" for none: it runs)."""
    if not mark:
        return ""
    return f"by calendar '{mark['calendar']}': {mark['entry']}"


def exclusion_text(exclusion: dict[str, Any] | None) -> str:
    """A skipped run's ``exclusion``: ``excluded by calendar 'us-holidays' r3: 2026-12-25``
    ("" for none)."""
    if not exclusion:
        return ""
    return (f"excluded by calendar '{exclusion['calendar']}' r{exclusion.get('revision', 0)}: "
            f"{exclusion['entry']}")


def state_text(doc: dict[str, Any]) -> str:
    """A run's state, with the calendar that excluded a skipped one: ``SKIPPED (excluded by
    calendar 'us-holidays' r3: 2026-12-25)``."""
    why = exclusion_text(doc.get("exclusion"))
    return f"{doc['state']} ({why})" if why else str(doc["state"])


def run(doc: dict[str, Any]) -> None:
    con = _console()
    pairs: list[tuple[str, Any]] = [
        ("run", doc["runId"]), ("traceId", doc.get("traceId")),
        ("schedule", f"{doc['scheduleId']} (revision {doc['revision']})"),
        ("trigger", doc["trigger"] + (f" key {doc['requestKey']}" if doc.get("requestKey")
                                      else "")),
        ("state", state_text(doc)), ("job", _job(doc.get("jobType"), doc.get("params"))),
        ("scheduledAt", doc["scheduledAt"]), ("dueAt", doc["dueAt"]),
        ("startedAt", doc["startedAt"]), ("finishedAt", doc["finishedAt"]),
        ("lateness", None if doc.get("latenessMs") is None else f"{doc['latenessMs']} ms"),
    ]
    pairs = [(k, v) for k, v in pairs if k != "job" or v is not None]
    for key in ("waiting", "skippedReason", "cancelReason", "deadReason", "deadMessage",
                "lastError"):
        if key == "skippedReason" and doc.get("exclusion"):
            continue  # said on the state line
        if doc.get(key):
            pairs.append((key, doc[key]))
    if doc.get("cancellationRequested"):
        pairs.append(("cancellation", "requested"))
    res = doc.get("result")
    if res is not None:
        where = res.get("uri") or short(json.dumps(res.get("inline")), 100)
        pairs.append(("result", f"{where} ({res['size']} bytes, checksum "
                                f"{res['checksum']}, attempt {res.get('attempt')})"))
    con.print(_kv(pairs))
    if doc.get("attempts"):
        con.print(_table("attempts", ["#", "fence", "worker", "claimedAt", "leaseUntil",
                                      "outcome", "error"],
                         [[a["attempt"], a["fence"], a["workerId"], _t(a["claimedAt"]),
                           _t(a["leaseUntil"]), a["outcome"] or "(running)",
                           a["error"] or ""] for a in doc["attempts"]]))
    if doc.get("effects"):
        con.print(_table("effects", ["effectId", "kind", "state", "attempts"],
                         [[e["effectId"], e["kind"], e["state"], e["attempts"]]
                          for e in doc["effects"]]))


def workers(doc: dict[str, Any], live: bool | None) -> None:
    con = _console()
    if not doc["items"]:
        con.print("no workers" + ("" if live is None else
                                  " live" if live else " that are not live"))
    else:
        con.print(_table(None, ["workerId", "live", "class", "jobTypes", "slots",
                                "lastSeen", "startedAt"],
                         [[w["workerId"], "yes" if w["live"] else
                           ("stopped" if w["stopped"] else "no"), c["resourceClass"],
                           ",".join(c["jobTypes"]) or "-", c["slots"], _t(w["lastSeen"]),
                           _t(w["startedAt"])]
                          for w in doc["items"] for c in w["classes"]]))
    _more(con, doc)


def calendar_written(result: dict[str, Any]) -> None:
    """A calendar put or deleted."""
    if result.get("deleted"):
        print(f"deleted calendar {result['name']} (revision {result['revision']})")
    else:
        print(f"calendar {result['name']} at revision {result['revision']}")


def calendar(doc: dict[str, Any]) -> None:
    """A calendar's document: its entries, revision and the schedules that name it."""
    d = doc["definition"]
    zone = d.get("timezone") or "UTC"
    rows: list[list[Any]] = [["date", x, zone] for x in d.get("dates") or ()]
    rows += [["range", f"{r['from']}..{r['to']}", r.get("timezone") or zone]
             for r in d.get("ranges") or ()]
    rows += [["window", f"{_days_text(w.get('days'))} {w['start']}-{w['end']}",
              w.get("timezone") or zone] for w in d.get("windows") or ()]
    con = _console()
    con.print(_kv([("calendar", doc["name"]), ("revision", doc["revision"]),
                   ("timezone", zone), ("updated", _t(doc.get("updatedAt"))),
                   ("used by", ", ".join(doc.get("usedBy") or ()) or "-")]))
    con.print(_table(None, ["excludes", "entry", "zone"], rows) if rows
              else "excludes nothing")


def calendars(doc: dict[str, Any]) -> None:
    """A page of the tenant's calendars."""
    _console().print(_table(None, ["name", "revision", "updated"], [
        [c["name"], c["revision"], _t(c.get("updatedAt"))] for c in doc["items"]]))
    if doc.get("nextCursor"):
        print(f"more: --after {doc['nextCursor']}")


def _days_text(days: list[str] | None) -> str:
    """A window's days: ``sat,sun``, or ``every day``."""
    return "every day" if not days or len(set(days)) == 7 else ",".join(days)
