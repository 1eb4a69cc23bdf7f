"""``chronolog audit``: fold the whole ``events`` log and check the guarantees of
docs/design.md §10.

    chronolog audit [--log URL | --data-dir DIR] [--partitions N] [--json]

Reads every partition of ``events`` from offset 0 to its end offset at the start of the
audit (committed reads, through the EventLog port), in move-barrier order (a moved key's
events on its old home before those on its new home: ``chronolog.projections.ordered``),
feeds each event to the pure checker (``chronolog.audit.auditor``) and then:

* no violation: prints one summary line (``audit ok: ...``) and exits 0;
* violations: prints each one (``VIOLATION <check>: <message>`` and, indented, its events as
  ``p<partition>@<offset> <type> <event_id>``), then a summary line, and exits 1;
* bad configuration (bad ``--log``, missing SQLite file, no ``events`` topic, bad
  ``--partitions``): one line on stderr, exit 2.

``--json`` prints the report as one JSON object instead (same exit statuses). A record that
does not decode is reported as a ``decodable`` violation. ``--partitions`` is only checked
against the log: every partition the log has is read, and a different count is noted on
stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronolog.archive import ArchiveError
from chronolog.archive.source import ArchivedHistory
from chronolog.audit.auditor import Auditor, AuditReport
from chronolog.audit.folds import CheckpointError
from chronolog.cli.errors import UsageError
from chronolog.cli.log_reader import (
    add_log_arguments,
    event_partitions,
    log_config,
    open_existing_log,
    read_in_order,
)
from chronolog.domain.barrier import Barrier, BarrierOrder
from chronolog.domain.codec import DecodeError, decode_event
from chronolog.environment import utc_now
from chronolog.log.audit_checkpoints import (
    AuditCheckpoint,
    CheckpointUnreadable,
    load_checkpoint,
    save_checkpoint,
)
from chronolog.log.port import EventLog, LogError, Record
from chronolog.log.reading import Readable
from chronolog.settings import RULES_HEADER


def register(subparsers: Any) -> None:
    """Add the ``audit`` sub-command to the ``chronolog`` parser."""
    parser = subparsers.add_parser(
        "audit",
        help="check the whole event log against the scheduler's guarantees",
        description="Fold every event of the log and check: one occurrence per key, fences "
                    "strictly increasing and current, one result per run within its lease, "
                    "overlap policies, misfire 'all' completeness, unique effects, COMPLETED "
                    "schedules final and true, each tenant's schedule quota kept and its "
                    "reservations balanced. Exit 0: clean; 1: violations; 2: bad "
                    "configuration.",
    )
    add_log_arguments(parser)
    parser.add_argument("--full", action="store_true",
                        help="fold every event from the beginning instead of going on from "
                             "the last checkpoint (the verdict is the same)")
    parser.add_argument("--archive", metavar="DIR", default=os.environ.get("CHRONOLOG_ARCHIVE"),
                        help="read the history below each partition's archived end from this "
                             "archive (env CHRONOLOG_ARCHIVE)")
    parser.add_argument("--no-save", action="store_true",
                        help="do not write a checkpoint where this audit stops")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


@dataclass
class AuditRun:
    """What one ``audit_log`` did: the report, and how it read the log."""

    report: AuditReport
    read: int = 0  # events read by this run
    resumed: AuditCheckpoint | None = None  # the checkpoint it went on from
    saved: bool = False


async def audit_log(log: EventLog, auditor: Auditor | None = None, *, full: bool = False,
                    save: bool = True, archive: Path | None = None) -> AuditRun:
    """Feed the committed events of every partition of ``events`` to an ``Auditor``: those
    after the latest checkpoint (``chronolog.log.audit_checkpoints``), or every one with
    ``full``; then save a checkpoint where it stopped (unless ``save`` is false). With
    ``archive``, the history below each partition's archived end is read from the archive
    (``chronolog.archive.source``): a segment that does not verify is an ``archive_intact``
    violation, and no checkpoint is saved."""
    topic = log.topics.events
    try:
        source: Readable = log if archive is None else ArchivedHistory(archive, log)
    except ArchiveError as exc:
        raise UsageError(str(exc)) from None
    partitions = await event_partitions(log)
    ends = {p: await log.end_offset(topic, p) for p in range(partitions)}
    notes: list[str] = []
    checkpoint, resumed = (None, None) if full or auditor is not None else (
        await _usable_checkpoint(log, source, ends, notes))
    auditor = resumed or auditor or Auditor()
    order = BarrierOrder(handovers=dict(checkpoint.handovers) if checkpoint else {})
    positions = dict(checkpoint.positions) if checkpoint else {}
    last_events = dict(checkpoint.last_events) if checkpoint else {}
    for p in range(partitions):
        gap = await _history_gap(log, source, p, positions.get(p, 0))
        if gap is not None:
            auditor.archive_damaged(gap)
            save = False
    newest: dict[int, tuple[str, str]] = {}  # partition -> (rules, processor) of its last event
    read = 0

    def stuck(partition: int, barrier: Barrier, rec: Record) -> None:
        auditor.handover_missing(partition, rec.offset, barrier.partition, barrier.version)

    # a moved key's events on its old home first, then on its new home (docs/design.md §10)
    try:
        async for taken in read_in_order(source, topic, ends, on_stuck=stuck, order=order,
                                         starts=positions):
            records = [rec for rec, _ in taken.items]
            newest[taken.partition] = (_writer(records[-1].headers)
                                       or newest.get(taken.partition, ("", "")))
            for rec, env in taken.items:
                read += 1
                if isinstance(env, DecodeError):
                    auditor.undecodable(rec.partition, rec.offset, str(env))
                    last_events[rec.partition] = f"{rec.offset}:?"
                    continue
                auditor.feed(env, rec.partition, rec.offset)
                last_events[rec.partition] = f"{rec.offset}:{env.event_id}"
            positions[taken.partition] = taken.end
    except ArchiveError as exc:  # the history cannot be read whole: said, not saved
        auditor.archive_damaged(f"{exc} (the audit stopped there; chronolog archive verify "
                                "lists every problem)")
        save = False
    report = auditor.finish()
    note = rules_mismatch_note(newest)
    run = AuditRun(report, read, checkpoint)
    if checkpoint is not None:
        notes.append(f"went on from the checkpoint of {checkpoint.taken_at} "
                     f"({checkpoint.events} events): {read} events read since")
    if save:
        try:
            await save_checkpoint(log, AuditCheckpoint(
                positions, last_events, dict(order.handovers), report.events,
                utc_now().isoformat().replace("+00:00", "Z")), auditor.checkpoint_lines())
            run.saved = True
        except LogError as exc:
            notes.append(f"checkpoint not saved ({exc}): the next audit reads these events "
                         "again")
    report.notes.extend(notes + ([note] if note else []))
    return run


async def _history_gap(log: EventLog, source: Readable, partition: int,
                       begin: int) -> str | None:
    """Why the history of ``partition`` from ``begin`` cannot be read whole: the log was
    pruned past ``begin`` and the archive (if any) does not hold what went (None: it can)."""
    start = await log.start_offset(log.topics.events, partition)
    if begin >= start:
        return None
    if isinstance(source, ArchivedHistory):
        entries = source.entries(partition)
        if entries and entries[0].start <= begin and source.archived_end(partition) >= start:
            return None
        held = (f"the archive holds [{entries[0].start}, {source.archived_end(partition)})"
                if entries else "the archive holds none of it")
    else:
        held = "no archive was given (--archive)"
    return (f"partition {partition}: events [{begin}, {start}) were pruned from the log and "
            f"{held}: the history there cannot be proved")


Usable = tuple[AuditCheckpoint, Auditor] | tuple[None, None]


async def _usable_checkpoint(log: EventLog, source: Readable, ends: dict[int, int],
                             notes: list[str]) -> Usable:
    """The latest checkpoint and the auditor resumed from it, if it is one of this log as it
    is (else ``(None, None)``, with a note)."""
    try:
        checkpoint = await load_checkpoint(log)
    except CheckpointUnreadable as exc:
        notes.append(f"{exc}: audited from the beginning")
        return None, None
    if checkpoint is None:
        return None, None
    for p, position in checkpoint.positions.items():
        if position > ends.get(p, 0):
            notes.append(f"the checkpoint of {checkpoint.taken_at} is past the end of "
                         f"partition {p} (another log, or one restored to an earlier point): "
                         "audited from the beginning")
            return None, None
    for p, where in checkpoint.last_events.items():
        offset, _, event_id = where.partition(":")
        try:
            records = await source.read(log.topics.events, p, int(offset), max_records=1)
        except ArchiveError:
            records = []
        found = records[0] if records and records[0].offset == int(offset) else None
        seen = None
        if found is not None:
            try:
                seen = decode_event(found.value).event_id
            except DecodeError:
                seen = "?"
        if seen != event_id:
            notes.append(f"the checkpoint of {checkpoint.taken_at} names event {event_id} at "
                         f"p{p}@{offset}, which the log does not hold there (another log, or "
                         "one restored): audited from the beginning")
            return None, None
    try:
        return checkpoint, Auditor.resume_document(checkpoint.document)
    except CheckpointError as exc:
        notes.append(f"the checkpoint of {checkpoint.taken_at} is unusable ({exc}): audited "
                     "from the beginning")
        return None, None


def _writer(headers: tuple[tuple[str, bytes], ...]) -> tuple[str, str] | None:
    found = dict(headers)
    rules = found.get(RULES_HEADER)
    if rules is None:
        return None
    return (rules.decode("utf-8", "replace"),
            found.get("processor", b"?").decode("utf-8", "replace"))


def rules_mismatch_note(newest: dict[int, tuple[str, str]]) -> str | None:
    """A note when the newest events of the partitions name different recurrence engines or
    tz databases (processors of one deployment computing instants differently)."""
    by_rules: dict[str, list[tuple[int, str]]] = {}
    for p, (rules, processor) in sorted(newest.items()):
        if rules:
            by_rules.setdefault(rules, []).append((p, processor))
    if len(by_rules) < 2:
        return None
    parts = []
    for rules, where in sorted(by_rules.items()):
        procs = ", ".join(sorted({proc for _, proc in where}))
        parts.append(f"{rules} on partitions {','.join(str(p) for p, _ in where)} "
                     f"(processor {procs})")
    return ("processors disagree on the rules engine / tz database: " + "; ".join(parts) +
            " (compare their instants with 'chronolog rules diff')")


async def _run(args: argparse.Namespace) -> AuditReport:
    cfg = log_config(args)
    log = await open_existing_log(cfg)
    try:
        if args.partitions is not None:
            actual = await event_partitions(log)
            if actual != args.partitions:
                print(f"note: {log.topics.events} has {actual} partitions, not "
                      f"{args.partitions}; reading all {actual}", file=sys.stderr)
        archive = Path(args.archive) if args.archive else None
        return (await audit_log(log, full=args.full, save=not args.no_save,
                                archive=archive)).report
    finally:
        await log.close()


def summary_line(report: AuditReport) -> str:
    """One line: what was read, and the violations per check (only the non-zero ones)."""
    seen = (f"{report.events} events, {report.schedules} schedules, {report.runs} runs, "
            f"{report.results} results, {report.effects} effects")
    if report.ok:
        return f"audit ok: {seen}; 0 violations"
    counts = ", ".join(f"{k}={v}" for k, v in report.violation_counts.items() if v)
    return f"audit FAILED: {len(report.violations)} violations ({counts}) in {seen}"


def format_report(report: AuditReport) -> str:
    """The human-readable report: each violation with its events, notes, the summary."""
    lines: list[str] = []
    for v in report.violations:
        where = f"{v.tenant}/{v.schedule_id}" if v.schedule_id else "-"
        run = f" run {v.run_id}" if v.run_id else ""
        lines.append(f"VIOLATION {v.check}: {v.message} [{where}{run}]")
        lines.extend(f"    {e}" for e in v.events)
    lines.extend(f"note: {n}" for n in report.notes)
    lines.append(summary_line(report))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Execute ``chronolog audit``."""
    report = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(format_report(report))
    return 0 if report.ok else 1
