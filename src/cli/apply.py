"""``chronolog apply``: schedules and calendars as code, from YAML or TOML files.

    chronolog apply -f PATH [-f PATH ...] [--prune] [--dry-run] [--set NAME] [--json]
                    [the transport flags of every user command: --url/--token, --data-dir,
                     or --log with its flags]

Each ``-f`` is a file (``.yaml``, ``.yml`` or ``.toml``) or a directory: its files with those
extensions, in name order, not its subdirectories (a directory is one set of files; pass
each subdirectory with its own ``-f``). A YAML file holds one or more documents separated by
``---`` (empty ones are skipped, but counted: ``document 3`` is the third); a TOML file is one
document. Each document is one object:

* ``kind: schedule``, ``id``, and the schedule's definition exactly as ``POST /v1/schedules``
  takes it (camelCase; ``chronolog.queries.documents.ScheduleDefinition``), ``labels``
  included;
* ``kind: calendar``, ``name``, and the calendar as ``PUT /v1/calendars/{name}`` takes it
  (``timezone``, ``dates``, ``ranges``, ``windows``).

YAML timestamps stay text (the API reads them), so ``at: 2026-03-08T09:00:00Z`` and
``dates: [2026-12-25]`` mean what they say; TOML dates and date-times become their ISO text.

Everything is validated before anything is sent, as the API validates it: a document that is
not valid, or an ID (or calendar name) twice in the files, refuses the whole apply with exit
status 2 and one line ``error: FILE, document N: FIELD: why``.

Then the tenant's schedules (every page of ``GET /v1/schedules``) and the calendars the files
name are read, and the plan made: a document whose definition, normalised as the API shows
it (defaults filled, durations in seconds, instants in UTC), equals the current one is
unchanged and nothing is sent for it — applying the same files twice writes nothing. Every
schedule written carries the label ``chronolog.dev/applied-by: <set>`` (``--set``, default
``default``). Writes, in this order: calendars (created, or revised with ``If-Match`` the
revision read), then schedules (created, or revised — ``PUT``, the whole definition — with
``If-Match`` the revision read: a concurrent edit between the read and the write is a
conflict, not a lost update), then, with ``--prune``, the set's schedules (by the label) the
files no longer hold are deleted. A schedule the files hold that carries another set's label
is refused (exit 1, nothing sent): a schedule belongs to one set. A schedule without the label
(made by hand) that the files name is taken into the set. Calendars are never pruned nor
deleted (schedules outside the set may name them). A schedule's state (paused or not) is not
the files': apply neither pauses nor resumes.

``--dry-run`` prints the plan — ``+`` added, ``~`` changed (then each field ``path: old ->
new``), ``-`` removed — and sends nothing: exit 0 when nothing would change, 1 when something
would. Without it: what was done, exit 0; 1 when any write was refused or not answered (one
line on stderr naming the schedule or calendar; the other writes are still made); 2 for bad
input. ``--json`` prints the plan (or the result: each change with its ``outcome``) as one
JSON document.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

import yaml

from chronolog.cli.errors import Failure, UsageError
from chronolog.cli.schedules import (
    DefinitionError,
    Work,
    add_common_flags,
    as_command,
    calendar_spec,
    definition_spec,
    print_json,
)
from chronolog.cli.transport import Ctx, Transport
from chronolog.domain.calendars import CALENDAR_NAME_PATTERN
from chronolog.domain.limits import id_problem
from chronolog.queries.documents import definition_document

__all__ = [
    "APPLIED_BY",
    "Change",
    "Document",
    "Plan",
    "apply_plan",
    "diff",
    "load_documents",
    "make_plan",
    "read_current",
    "register",
]

#: the label that names the set a schedule was applied from
APPLIED_BY = "chronolog.dev/applied-by"
DEFAULT_SET = "default"
SUFFIXES = (".yaml", ".yml", ".toml")
_SET_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_KINDS = ("schedule", "calendar")


def register(sub: Any) -> None:
    """Add ``apply``."""
    p = sub.add_parser(
        "apply", help="create, revise (and with --prune delete) schedules and calendars from "
        "YAML or TOML files",
        description="Make the tenant's schedules and calendars those of the files: each "
        "document is 'kind: schedule' with 'id' and the API's definition, or 'kind: calendar' "
        "with 'name' and the calendar. Everything is validated first; unchanged ones are left "
        "alone; changed ones are revised at the revision read (a concurrent edit is a "
        "conflict). Calendars are never deleted.")
    p.add_argument("-f", dest="paths", action="append", required=True,
                   metavar="PATH", help="a .yaml, .yml or .toml file, or a directory of them "
                   "(not its subdirectories); repeatable")
    p.add_argument("--prune", action="store_true",
                   help="also delete the set's schedules (label chronolog.dev/applied-by) the "
                   "files no longer hold; never any other schedule, never a calendar")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan, send nothing: exit 0 when nothing would change, 1 "
                   "when something would")
    p.add_argument("--set", dest="set_name", default=DEFAULT_SET, metavar="NAME",
                   help=f"the set these files are (default '{DEFAULT_SET}'): recorded in "
                   f"each schedule's label {APPLIED_BY}; --prune deletes only its schedules")
    add_common_flags(p, write=True)
    p.set_defaults(func=as_command(_apply))


# =======================================================================================
# the files


@dataclass(frozen=True)
class Document:
    """One valid document of the files: ``body`` is what is sent (a schedule's with its
    set's label), ``normal`` its definition as the API shows it, to compare with."""

    kind: str  # schedule | calendar
    key: str  # the schedule's ID, the calendar's name
    where: str  # ``jobs.yaml, document 2``
    body: dict[str, Any]
    normal: dict[str, Any]
    spec: Any = None  # a schedule's ScheduleSpec


def _bad(where: str, what: str, why: str) -> UsageError:
    return UsageError(f"{where}: {what}: {why}")


def files_of(paths: Iterable[str]) -> list[Path]:
    """The files the ``-f`` paths name: a file as given (of a known suffix), a directory's
    files of the known suffixes in name order (hidden ones and subdirectories left out)."""
    out: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.is_file() and
                              p.suffix.lower() in SUFFIXES and not p.name.startswith(".")))
        elif path.is_file():
            if path.suffix.lower() not in SUFFIXES:
                raise UsageError(f"{text}: not a .yaml, .yml or .toml file")
            out.append(path)
        elif path.exists():
            raise UsageError(f"{text}: not a regular file or directory")
        else:
            raise UsageError(f"{text}: no such file or directory")
    unique = list(dict.fromkeys(out))
    if not unique:
        raise UsageError(f"{', '.join(paths)}: no .yaml, .yml or .toml file")
    return unique


class _Loader(yaml.SafeLoader):
    """YAML's safe loader with timestamps left as text (the API reads instants and dates
    itself, and a YAML timestamp without an offset would silently be UTC)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _plain(value: Any) -> Any:
    """TOML's dates and times as ISO text; the rest as is."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    return value


def read_file(path: Path) -> list[tuple[int, Any]]:
    """The documents of one file, numbered from 1 (empty YAML documents left out)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}"
                         ) from None
    if path.suffix.lower() == ".toml":
        try:
            return [(1, _plain(tomllib.loads(text)))]
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: not valid TOML: {exc}") from None
    try:
        docs = list(yaml.load_all(text, Loader=_Loader))  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{path}: not valid YAML{at}: {problem}") from None
    return [(i, d) for i, d in enumerate(docs, 1) if d is not None]


def parse_document(raw: Any, where: str, set_name: str) -> Document:
    """One document, validated as the API validates it (``UsageError``: ``where: field:
    why``)."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: a document is a mapping with kind: schedule or kind: "
                         f"calendar")
    body = dict(raw)
    kind = body.pop("kind", None)
    if kind not in _KINDS:
        raise _bad(where, "kind", "is required: schedule or calendar" if kind is None
                   else f"'{kind}': must be schedule or calendar")
    name_field = "id" if kind == "schedule" else "name"
    key = body.pop(name_field, None)
    if key is None:
        raise _bad(where, name_field, "is required")
    if not isinstance(key, str):
        raise _bad(where, name_field, "must be a string")
    if kind == "calendar":
        if not re.fullmatch(CALENDAR_NAME_PATTERN, key):
            raise _bad(where, "name", f"'{key[:100]}': letters, digits and _ . - (not first), "
                       f"1-100 characters")
        try:
            cal = calendar_spec(body)
        except DefinitionError as exc:
            raise _bad(where, exc.field, exc.reason) from None
        normal = cal.model_dump(mode="json", by_alias=True)
        return Document("calendar", key, where, normal, normal)
    problem = id_problem("schedule ID", key)
    if problem is not None:
        raise _bad(where, "id", problem.removeprefix("schedule ID "))
    labels = body.get("labels", {})
    if labels is None:
        labels = {}
    if not isinstance(labels, dict):
        raise _bad(where, "labels", "must be a mapping of names to text")
    if APPLIED_BY in labels:
        raise _bad(where, f"labels.{APPLIED_BY}", "set by apply itself (--set NAME)")
    body["labels"] = {**labels, APPLIED_BY: set_name}
    try:
        spec = definition_spec(body)
    except DefinitionError as exc:
        raise _bad(where, exc.field, exc.reason) from None
    return Document("schedule", key, where, body, _normal_spec(spec), spec)


def _normal_spec(spec: Any) -> dict[str, Any]:
    """A spec's definition as ``GET /v1/schedules/{id}`` shows it."""
    return definition_document(spec.model_dump(mode="json"))


def check_set_name(name: str) -> str:
    if not _SET_NAME.fullmatch(name):
        raise UsageError(f"invalid set '{name[:80]}': letters, digits and _ . - (starting and "
                         f"ending with a letter or digit), 1-63 characters")
    return name


def load_documents(paths: Sequence[str], set_name: str) -> list[Document]:
    """Every document of the files, validated; an ID or name twice is refused."""
    docs: list[Document] = []
    seen: dict[tuple[str, str], str] = {}
    for path in files_of(paths):
        for index, raw in read_file(path):
            doc = parse_document(raw, f"{path}, document {index}", set_name)
            first = seen.get((doc.kind, doc.key))
            if first is not None:
                what = "id" if doc.kind == "schedule" else "name"
                raise _bad(doc.where, what, f"'{doc.key}' is also in {first}")
            seen[(doc.kind, doc.key)] = doc.where
            docs.append(doc)
    if not docs:
        raise UsageError(f"{', '.join(paths)}: no documents (nothing to apply)")
    return docs


# =======================================================================================
# the plan


_NONE = "<none>"


def _shown(value: Any) -> str:
    return _NONE if value is _MISSING else json.dumps(value, ensure_ascii=False)


_MISSING: Any = object()


def diff(old: dict[str, Any], new: dict[str, Any], path: str = "") -> list[tuple[str, Any, Any]]:
    """The fields that differ, ``(path, old, new)`` (objects compared member by member,
    arrays whole; a member one side lacks is ``_MISSING`` there), in a stable order."""
    out: list[tuple[str, Any, Any]] = []
    for key in [*old, *(k for k in new if k not in old)]:
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        where = f"{path}.{key}" if path else key
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(diff(a, b, where))
        elif a != b or (type(a) is not type(b) and not _same_number(a, b)):
            out.append((where, a, b))
    return out


def _same_number(a: Any, b: Any) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
        not isinstance(a, bool) and not isinstance(b, bool) and a == b


@dataclass
class Change:
    """One write of the plan: ``action`` add, change or remove; ``revision`` the one read
    (the ``If-Match`` of a change); after ``apply_plan``, its ``outcome`` (created, revised,
    deleted, refused) and ``written`` (the new revision) or ``error``."""

    kind: str
    key: str
    action: str
    revision: int | None = None
    fields: list[tuple[str, Any, Any]] = field(default_factory=list)
    doc: Document | None = None
    outcome: str | None = None
    written: int | None = None
    error: Failure | None = None
    warnings: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind,
                               "id" if self.kind == "schedule" else "name": self.key,
                               "action": self.action, "revision": self.revision}
        if self.action == "change":
            out["fields"] = [{"path": p, "old": None if a is _MISSING else a,
                              "new": None if b is _MISSING else b} for p, a, b in self.fields]
        if self.outcome is not None:
            out["outcome"] = self.outcome
            if self.written is not None:
                out["writtenRevision"] = self.written
            if self.error is not None:
                out["error"] = self.error.document()
            if self.warnings:
                out["warnings"] = self.warnings
        return out


@dataclass
class Plan:
    set_name: str
    changes: list[Change]
    unchanged: list[tuple[str, str]]  # (kind, key)
    conflicts: list[str]  # schedules of the files another set holds: nothing is sent

    @property
    def empty(self) -> bool:
        return not self.changes

    def counts(self) -> dict[str, int]:
        return {a: sum(1 for c in self.changes if c.action == a)
                for a in ("add", "change", "remove")} | {"unchanged": len(self.unchanged)}


@dataclass
class Current:
    """What the tenant has now: its schedules (not DELETED) by ID, and the calendars the
    files name (None: none of that name)."""

    schedules: dict[str, dict[str, Any]]
    calendars: dict[str, dict[str, Any] | None]


async def read_current(t: Transport, docs: Sequence[Document]) -> Current:
    schedules = {s["scheduleId"]: s for s in await t.all_schedules()}
    calendars: dict[str, dict[str, Any] | None] = {}
    for doc in docs:
        if doc.kind == "calendar":
            try:
                calendars[doc.key] = await t.calendar(doc.key)
            except Failure as exc:
                if exc.status != "not_found":
                    raise
                calendars[doc.key] = None
    return Current(schedules, calendars)


def _current_normal(kind: str, definition: dict[str, Any]) -> dict[str, Any]:
    """A current definition through the same normalisation as the files' (as it was shown
    when it no longer passes today's checks)."""
    try:
        if kind == "calendar":
            return calendar_spec(definition).model_dump(mode="json", by_alias=True)
        return _normal_spec(definition_spec(definition))
    except DefinitionError:
        return definition


def make_plan(docs: Sequence[Document], current: Current, set_name: str,
              prune: bool) -> Plan:
    """Calendars first, then schedules, then (``prune``) the set's schedules the files no
    longer hold, each in the files' order (removals by ID)."""
    changes: list[Change] = []
    unchanged: list[tuple[str, str]] = []
    conflicts: list[str] = []
    ordered = [d for d in docs if d.kind == "calendar"] + [d for d in docs
                                                           if d.kind == "schedule"]
    for doc in ordered:
        if doc.kind == "calendar":
            now = current.calendars.get(doc.key)
        else:
            now = current.schedules.get(doc.key)
        if now is None:
            changes.append(Change(doc.kind, doc.key, "add", doc=doc))
            continue
        if doc.kind == "schedule":
            owner = (now["definition"].get("labels") or {}).get(APPLIED_BY)
            if owner is not None and owner != set_name:
                conflicts.append(f"schedule {doc.key} ({doc.where}) belongs to set '{owner}' "
                                 f"(label {APPLIED_BY}): remove it from one of the sets")
                continue
        fields = diff(_current_normal(doc.kind, now["definition"]), doc.normal)
        if fields:
            changes.append(Change(doc.kind, doc.key, "change", now["revision"], fields, doc))
        else:
            unchanged.append((doc.kind, doc.key))
    if prune:
        held = {d.key for d in docs if d.kind == "schedule"}
        for sid, now in sorted(current.schedules.items()):
            labels = now["definition"].get("labels") or {}
            if labels.get(APPLIED_BY) == set_name and sid not in held:
                changes.append(Change("schedule", sid, "remove", now["revision"]))
    return Plan(set_name, changes, unchanged, conflicts)


# =======================================================================================
# the writes


async def apply_plan(t: Transport, plan: Plan) -> None:
    """Make each change (calendars, schedules, removals: the plan's order); a refused or
    unanswered one is recorded (``outcome`` refused) and the others are still made."""
    for c in plan.changes:
        try:
            if c.kind == "calendar":
                assert c.doc is not None
                result = await t.put_calendar(c.key, c.doc.body, c.revision)
                c.outcome = "created" if c.action == "add" else "revised"
            elif c.action == "add":
                assert c.doc is not None
                result = await t.create_schedule(c.key, c.doc.body, c.doc.spec, None)
                c.outcome = "created"
                c.warnings = list(result.get("warnings") or ())
            elif c.action == "change":
                assert c.doc is not None and c.revision is not None
                result = await t.revise_schedule(c.key, c.doc.body, c.doc.spec, c.revision)
                c.outcome = "revised"
            else:
                result = await t.change_state(c.key, "delete", "")
                c.outcome = "deleted"
            c.written = result.get("revision")
        except Failure as exc:
            c.outcome, c.error = "refused", exc


# =======================================================================================
# the command


def _apply(ctx: Ctx) -> Work:
    args = ctx.args
    set_name = check_set_name(args.set_name)
    docs = load_documents(args.paths, set_name)  # UsageError: exit 2, nothing sent

    async def work(t: Transport) -> int:
        plan = make_plan(docs, await read_current(t, docs), set_name, args.prune)
        if plan.conflicts:
            for line in plan.conflicts:
                print(f"error: conflict: {line}", file=sys.stderr)
            if args.json:
                print_json(_plan_document(plan, args.dry_run))
            return 1
        if args.dry_run:
            if args.json:
                print_json(_plan_document(plan, True))
            else:
                _print_plan(plan)
            return 0 if plan.empty else 1
        await apply_plan(t, plan)
        refused = [c for c in plan.changes if c.outcome == "refused"]
        if args.json:
            print_json(_plan_document(plan, False))
        else:
            _print_result(plan)
        for c in plan.changes:
            for w in c.warnings:
                print(f"warning: {c.kind} {c.key}: {w}", file=sys.stderr)
        for c in refused:
            assert c.error is not None
            print(f"error: {c.kind} {c.key}: {c.error.status}: {c.error.message}",
                  file=sys.stderr)
        return 1 if refused else 0

    return work


def _plan_document(plan: Plan, dry_run: bool) -> dict[str, Any]:
    return {"set": plan.set_name, "dryRun": dry_run,
            "changes": [c.document() for c in plan.changes],
            "unchanged": [{"kind": k, "id" if k == "schedule" else "name": key}
                          for k, key in plan.unchanged],
            "conflicts": plan.conflicts, "counts": plan.counts()}


_SIGN = {"add": "+", "change": "~", "remove": "-"}


def _lines(c: Change) -> list[str]:
    head = f"{_SIGN[c.action]} {c.kind} {c.key}"
    if c.action == "change":
        head += f" (revision {c.revision})"
    return [head, *(f"    {p}: {_shown(a)} -> {_shown(b)}" for p, a, b in c.fields)]


def _print_plan(plan: Plan) -> None:
    for c in plan.changes:
        print("\n".join(_lines(c)))
    n = plan.counts()
    print(f"plan (set {plan.set_name}): {n['add']} to add, {n['change']} to change, "
          f"{n['remove']} to remove, {n['unchanged']} unchanged")


def _print_result(plan: Plan) -> None:
    for c in plan.changes:
        if c.outcome == "refused":
            continue
        at = f" (revision {c.written})" if c.written is not None and c.outcome != "deleted" \
            else ""
        lines = _lines(c)
        print(f"{c.outcome} {c.kind} {c.key}{at}")
        if len(lines) > 1:
            print("\n".join(lines[1:]))
    done = {o: sum(1 for c in plan.changes if c.outcome == o)
            for o in ("created", "revised", "deleted", "refused")}
    refused = f", {done['refused']} refused" if done["refused"] else ""
    print(f"applied (set {plan.set_name}): {done['created']} created, {done['revised']} "
          f"revised, {done['deleted']} deleted, {len(plan.unchanged)} unchanged{refused}")
