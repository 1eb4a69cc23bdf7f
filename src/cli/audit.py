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
import sys
from typing import Any

from chronolog.audit.auditor import Auditor, AuditReport
from chronolog.cli.log_reader import (
    add_log_arguments,
    event_partitions,
    log_config,
    open_existing_log,
    read_in_order,
)
from chronolog.domain.barrier import Barrier
from chronolog.domain.codec import DecodeError
from chronolog.log.port import EventLog, Record
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
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


async def audit_log(log: EventLog, auditor: Auditor | None = None) -> AuditReport:
    """Feed every committed event of every partition of ``events`` to an ``Auditor``."""
    auditor = auditor or Auditor()
    topic = log.topics.events
    partitions = await event_partitions(log)
    newest: dict[int, tuple[str, str]] = {}  # partition -> (rules, processor) of its last event
    ends = {p: await log.end_offset(topic, p) for p in range(partitions)}

    def stuck(partition: int, barrier: Barrier, rec: Record) -> None:
        auditor.handover_missing(partition, rec.offset, barrier.partition, barrier.version)

    # a moved key's events on its old home first, then on its new home (docs/design.md §10)
    async for taken in read_in_order(log, topic, ends, on_stuck=stuck):
        records = [rec for rec, _ in taken.items]
        newest[taken.partition] = (_writer(records[-1].headers)
                                   or newest.get(taken.partition, ("", "")))
        for rec, env in taken.items:
            if isinstance(env, DecodeError):
                auditor.undecodable(rec.partition, rec.offset, str(env))
                continue
            auditor.feed(env, rec.partition, rec.offset)
    report = auditor.finish()
    note = rules_mismatch_note(newest)
    if note:
        report.notes.append(note)
    return report


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
        return await audit_log(log)
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
