"""``chronolog rules snapshot`` / ``chronolog rules diff``: a shadow check of the recurrence
rules against an engine or tz database upgrade.

    chronolog rules snapshot [--days 31] [--from ISO] [--out FILE]
                             [--database-url DSN | --data-dir DIR]
    chronolog rules diff SNAPSHOT [--json]

``snapshot`` reads every live (ACTIVE or PAUSED) schedule of every tenant from the read
model and writes one JSON document (to ``--out``, else stdout): a header naming the
recurrence engine and the tz database it resolved with (version and where ``zoneinfo``
read it), the window ``(from, to]`` (``--from``, default now; ``--days``, default 31), each
zone's UTC-offset transitions in the window, and per schedule its rule and its instants
in the window (UTC and local).

``diff`` resolves the snapshot's rules over the snapshot's window with the engine and tz
database installed now, and lists every schedule whose instants change: ``moved`` (the
same local wall time at another instant), ``added``, ``removed``, each with the
daylight-saving transition involved (one that differs between the two tz databases; none
when the engine moved it). Exit status: 0 nothing would change; 1 some schedule would; 2
bad input (an unreadable or invalid snapshot, naming the problem, one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import asyncpg
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from chronolog.cli.errors import UsageError
from chronolog.cli.flags import existing_database
from chronolog.domain.recurrence import RecurrenceError, parse_instant
from chronolog.domain.shadow import Transition, compare, resolve, transitions, utc_text
from chronolog.environment import utc_now
from chronolog.queries.read_model import live_rules
from chronolog.settings import installed_rules

FORMAT = "chronolog.rules-snapshot"
FORMAT_VERSION = 1
MAX_DAYS = 366


def register(subparsers: Any) -> None:
    """Add ``rules snapshot`` and ``rules diff`` to the ``chronolog`` parser."""
    parser = subparsers.add_parser(
        "rules", help="shadow check of the recurrence rules (engine / tz database upgrades)",
        description="Snapshot the next instants of every live schedule, and diff them against "
                    "the engine and tz database installed now.")
    sub = parser.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True)
    snap = sub.add_parser(
        "snapshot", help="write every live schedule's instants of the next days",
        description="Write, for every live schedule, its instants in (from, from + days] "
                    "resolved with the installed engine and tz database (both named in the "
                    "file's header).")
    snap.add_argument("--days", type=_days, default=31, metavar="N",
                      help=f"length of the window in days (1..{MAX_DAYS}, default 31)")
    snap.add_argument("--from", dest="from_", metavar="ISO",
                      help="start of the window, an instant with an offset (default now)")
    snap.add_argument("--out", metavar="FILE", help="write the snapshot here (default stdout)")
    snap.add_argument("--database-url", default=None, metavar="DSN",
                      help="the read model's PostgreSQL (env CHRONOLOG_DATABASE_URL; default: "
                           "the embedded PostgreSQL of --data-dir)")
    snap.add_argument("--data-dir", default=None, metavar="DIR",
                      help="data directory of a dev node (default ./.chronolog)")
    snap.set_defaults(func=run_snapshot)
    diff = sub.add_parser(
        "diff", help="list the schedules whose instants the installed engine / tz data change",
        description="Resolve a snapshot's rules again with the engine and tz database "
                    "installed now. Exit 0: no change; 1: some schedule's instants change; 2: "
                    "bad input.")
    diff.add_argument("snapshot", metavar="SNAPSHOT", help="a file written by 'rules snapshot'")
    diff.add_argument("--json", action="store_true", help="print the differences as JSON")
    diff.set_defaults(func=run_diff)


def _days(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_DAYS:
        raise argparse.ArgumentTypeError(
            f"invalid days '{text[:24]}': expected a whole number 1..{MAX_DAYS}")
    return int(text)


# ------------------------------------------------------------------------------ the file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Instant(_Strict):
    utc: str
    local: str

    @field_validator("utc", "local")
    @classmethod
    def _an_instant(cls, value: str) -> str:
        try:
            _parse_utc(value)
        except ValueError:
            raise ValueError(f"not an instant '{value[:40]}'") from None
        return value


class _Dst(_Strict):
    ambiguous: str = "first"
    nonexistent: str = "shift_forward"


class _Rule(_Strict):
    cron: str | None = None
    every: float | None = None
    delay: float | None = None
    at: str | None = None
    timezone: str = "UTC"
    anchor: str | None = None
    start: str | None = None
    end: str | None = None
    dst: _Dst = Field(default_factory=_Dst)


class _Schedule(_Strict):
    tenant: str
    scheduleId: str
    state: str
    rule: _Rule
    instants: list[_Instant] = Field(default_factory=list)
    truncated: bool = False
    error: str | None = None


class _Transition(_Strict):
    at: str
    before: str
    after: str
    dst: bool


class Snapshot(_Strict):
    """The snapshot file (``format``, ``formatVersion`` and the versions first: its header)."""

    format: Literal["chronolog.rules-snapshot"]
    formatVersion: Literal[1]
    engine: str
    tzdata: str
    tzdataSource: str
    createdAt: str
    from_: str = Field(alias="from")
    to: str
    days: int
    zones: dict[str, list[_Transition]]
    schedules: list[_Schedule]


def load_snapshot(path: str) -> Snapshot:
    """Read and check a snapshot file; any problem is a ``UsageError`` naming it."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise UsageError(f"invalid snapshot '{path}': cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"invalid snapshot '{path}': not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"invalid snapshot '{path}': not a chronolog rules snapshot "
                         f"(format must be '{FORMAT}')")
    try:
        snap = Snapshot.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(document)"
        raise UsageError(f"invalid snapshot '{path}': field {where}: {err['msg']}") from None
    for name, value in (("from", snap.from_), ("to", snap.to)):
        try:
            _parse_utc(value)
        except ValueError:
            raise UsageError(f"invalid snapshot '{path}': field {name}: not an instant "
                             f"'{value[:40]}'") from None
    if _parse_utc(snap.to) <= _parse_utc(snap.from_):
        raise UsageError(f"invalid snapshot '{path}': field to: not after from")
    return snap


def _parse_utc(text: str) -> datetime:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError(text)
    return t.astimezone(UTC)


# ------------------------------------------------------------------------------ snapshot


def build_snapshot(rules: list[dict[str, Any]], start: datetime, days: int) -> dict[str, Any]:
    """The snapshot document of these schedules' rules over ``(start, start + days]``."""
    end = start + timedelta(days=days)
    installed = installed_rules()
    zones = sorted({r["rule"]["timezone"] for r in rules})
    schedules = []
    for r in rules:
        resolved = resolve(r["rule"], start, end)
        schedules.append({**r, **({"instants": resolved["instants"],
                                   "truncated": resolved["truncated"]}
                                  if "error" not in resolved else
                                  {"instants": [], "error": resolved["error"]})})
    return {
        "format": FORMAT, "formatVersion": FORMAT_VERSION,
        "engine": installed.engine, "tzdata": installed.tzdata,
        "tzdataSource": installed.tzdata_source,
        "createdAt": utc_text(utc_now().replace(microsecond=0)),
        "from": utc_text(start), "to": utc_text(end), "days": days,
        "zones": {z: [t.to_dict() for t in transitions(z, start, end)] for z in zones},
        "schedules": schedules,
    }


async def _live_rules(args: argparse.Namespace) -> list[dict[str, Any]]:
    async with existing_database(args, "rules snapshot") as dsn:
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, timeout=10)
        except Exception as exc:  # noqa: BLE001 - any connect failure is configuration
            raise UsageError(f"invalid database-url: cannot connect ({exc})") from None
        assert pool is not None
        try:
            return await live_rules(pool)
        except asyncpg.UndefinedTableError:
            raise UsageError("invalid database-url: the database holds no chronolog read "
                             "model") from None
        finally:
            await pool.close()


def run_snapshot(args: argparse.Namespace) -> int:
    """Execute ``chronolog rules snapshot``."""
    if args.from_ is None:
        start = utc_now().replace(microsecond=0)
    else:
        try:
            start = parse_instant(args.from_, "UTC", field="from")
        except RecurrenceError as exc:
            raise UsageError(str(exc)) from None
    if args.out is not None:
        out_dir = Path(args.out).parent
        if not out_dir.is_dir():
            raise UsageError(f"invalid out '{args.out}': no directory {out_dir}")
    rules = asyncio.run(_live_rules(args))
    doc = build_snapshot(rules, start, args.days)
    text = json.dumps(doc, indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        tmp = f"{args.out}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, args.out)
        except OSError as exc:
            raise UsageError(f"invalid out '{args.out}': {exc.strerror}") from None
        n = sum(len(s["instants"]) for s in doc["schedules"])
        print(f"rules snapshot: {len(doc['schedules'])} schedules, {n} instants in "
              f"({doc['from']}, {doc['to']}] with engine {doc['engine']}, tzdata "
              f"{doc['tzdata']} ({doc['tzdataSource']}) -> {args.out}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------ diff


def diff_snapshot(snap: Snapshot) -> dict[str, Any]:
    """The differences between a snapshot and the engine / tz database installed now."""
    start, end = _parse_utc(snap.from_), _parse_utc(snap.to)
    installed = installed_rules()
    now_zones: dict[str, list[Transition]] = {}
    changed = []
    for s in snap.schedules:
        zone = s.rule.timezone
        if zone not in now_zones:
            now_zones[zone] = transitions(zone, start, end)
        recorded_t = [Transition(t.at, t.before, t.after, t.dst)
                      for t in snap.zones.get(zone, [])]
        now = resolve(s.rule.model_dump(), start, end)
        cmp = compare([i.model_dump() for i in s.instants], now, recorded_t, now_zones[zone])
        if not cmp.changed:
            continue
        counts = {k: sum(1 for c in cmp.changes if c.change == k)
                  for k in ("moved", "added", "removed")}
        changed.append({
            "tenant": s.tenant, "scheduleId": s.scheduleId, "timezone": zone,
            **counts, "error": cmp.error, "changes": [c.to_dict() for c in cmp.changes],
            "transitionsRemoved": [t.to_dict() for t in cmp.transitions_removed],
            "transitionsAdded": [t.to_dict() for t in cmp.transitions_added],
        })
    return {
        "snapshot": {"engine": snap.engine, "tzdata": snap.tzdata,
                     "tzdataSource": snap.tzdataSource, "from": snap.from_, "to": snap.to},
        "installed": {"engine": installed.engine, "tzdata": installed.tzdata,
                      "tzdataSource": installed.tzdata_source},
        "schedules": len(snap.schedules), "changed": changed,
    }


def _when(i: dict[str, str] | None) -> str:
    return "-" if i is None else f"{i['utc']} ({i['local']})"


def format_diff(report: dict[str, Any]) -> str:
    s, n = report["snapshot"], report["installed"]
    lines = [f"snapshot: engine {s['engine']}, tzdata {s['tzdata']} ({s['tzdataSource']}), "
             f"window ({s['from']}, {s['to']}]",
             f"installed: engine {n['engine']}, tzdata {n['tzdata']} ({n['tzdataSource']})"]
    for c in report["changed"]:
        head = (f"CHANGED {c['tenant']}/{c['scheduleId']} ({c['timezone']}): {c['moved']} "
                f"moved, {c['added']} added, {c['removed']} removed")
        lines.append(head + (f"; the rule no longer resolves: {c['error']}"
                             if c["error"] else ""))
        for t in c["transitionsRemoved"]:
            lines.append(f"    transition gone: {_transition_text(c['timezone'], t)}")
        for t in c["transitionsAdded"]:
            lines.append(f"    transition new:  {_transition_text(c['timezone'], t)}")
        for ch in c["changes"]:
            t = ch["transition"]
            via = f"  [tz: {t['at']} {t['before']} -> {t['after']}]" if t else "  [engine]"
            lines.append(f"    {ch['change']:<7} {_when(ch['before'])} -> "
                         f"{_when(ch['after'])}{via}")
    k = len(report["changed"])
    lines.append(f"rules diff: {k} of {report['schedules']} schedules would change"
                 if k else f"rules diff: none of {report['schedules']} schedules would change")
    return "\n".join(lines)


def _transition_text(zone: str, t: dict[str, Any]) -> str:
    return Transition(t["at"], t["before"], t["after"], t["dst"]).text(zone)


def run_diff(args: argparse.Namespace) -> int:
    """Execute ``chronolog rules diff``."""
    snap = load_snapshot(args.snapshot)
    report = diff_snapshot(snap)
    print(json.dumps(report) if args.json else format_diff(report))
    return 1 if report["changed"] else 0
