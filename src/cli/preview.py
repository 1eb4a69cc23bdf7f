"""``chronolog preview``: show the next instants a recurrence rule fires at.

    chronolog preview (--cron EXPR | --every DUR [--anchor ISO] | --at ISO)
                      [--tz ZONE] [--from ISO] [-n N]
                      [--dst-ambiguous first|second|both]
                      [--dst-nonexistent shift_forward|skip] [--json]

Prints the next N (default 5) instants strictly after ``--from`` (default: now) as a table
with UTC and local columns, or with ``--json`` exactly
``{"instants": [{"utc": "...Z", "local": "...+hh:mm", "dst": ..., "note": ...}, ...],
"skipped": [...]}`` (seconds precision). A cron instant that daylight saving time moved
is marked as on the dashboard (``chronolog.domain.recurrence.dst_marks``): ``shifted`` (its
wall time does not exist that day), ``repeated`` (its wall time happens twice); an instant
the transition left out between the first and the last is listed as ``skipped`` (in the
table with ``-`` for its number, in JSON under ``skipped``: it never runs). The table then
ends with a legend line per mark shown; ``dst`` and ``note`` are null on an unmarked
instant. ``--every`` without ``--anchor`` is anchored at ``--from``. Naive ISO times are
wall times in ``--tz``. Bad input exits with status 2 and one line naming the field and
value.
Offline, it reads no exclusion calendar: an instant a schedule's calendars exclude is listed
unmarked here (``chronolog schedule show`` marks its next instants, ``GET
/v1/preview?exclude=`` a rule's, against the calendars the node holds).
This is the only recurrence module allowed to read the clock (for the default ``--from``).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from chronolog.domain.recurrence import (
    DST_AMBIGUOUS_CHOICES,
    DST_NONEXISTENT_CHOICES,
    RecurrenceError,
    Trigger,
    compile_trigger,
    dst_marks,
    marked_rows,
    parse_instant,
    resolve_zone,
    upcoming,
)
from chronolog.environment import utc_now

DEFAULT_COUNT = 5
MAX_COUNT = 10_000


def register(subparsers: Any) -> None:
    """Add the ``preview`` sub-command to the ``chronolog`` parser."""
    parser = subparsers.add_parser(
        "preview",
        help="show the next instants a cron / interval / one-shot rule fires at",
        description="Show the next N instants strictly after --from (default now), marking "
                    "those daylight saving time shifted or repeated, and listing those it "
                    "left out as skipped.",
    )
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--cron", metavar="EXPR",
                      help="5-field cron (L, W, #, wrapping ranges) or @daily-style macro")
    kind.add_argument("--every", metavar="DUR", help="interval, e.g. 15m, 1h30m, PT15M")
    kind.add_argument("--at", metavar="ISO", help="one-shot instant")
    parser.add_argument("--anchor", metavar="ISO", help="alignment of --every (default: --from)")
    parser.add_argument("--tz", default="UTC", metavar="ZONE", help="IANA zone (default UTC)")
    parser.add_argument("--from", dest="from_", metavar="ISO",
                        help="start after this instant (default now)")
    parser.add_argument("-n", "--count", dest="n", type=_count, default=DEFAULT_COUNT,
                        metavar="N", help="how many (default 5; the API's `count`)")
    parser.add_argument("--dst-ambiguous", default="first", choices=DST_AMBIGUOUS_CHOICES,
                        help="a fixed-time cron wall time that happens twice: which pass")
    parser.add_argument("--dst-nonexistent", default="shift_forward",
                        choices=DST_NONEXISTENT_CHOICES,
                        help="a fixed-time cron wall time that does not exist: shift or skip")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def _count(text: str) -> int:
    """``-n``: a whole number in ASCII digits (``int`` alone would read other scripts' digits)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(
            f"invalid n '{text[:24]}': expected a whole number (ASCII digits)")
    if len(text.lstrip("0")) > len(str(MAX_COUNT)):
        raise argparse.ArgumentTypeError(
            f"invalid n '{text[:24]}': must be between 1 and {MAX_COUNT}")
    return int(text)


def _usage_error(message: str) -> Exception:
    """A chronolog.cli.errors.UsageError (imported late: cli imports this module)."""
    from chronolog.cli.errors import UsageError

    return UsageError(message)


def _check_args(args: argparse.Namespace) -> None:
    """Argument combinations argparse cannot express."""
    if args.anchor is not None and args.every is None:
        raise _usage_error(f"invalid anchor '{args.anchor}': --anchor only applies to --every")
    if not 1 <= args.n <= MAX_COUNT:
        raise _usage_error(f"invalid n '{args.n}': must be between 1 and {MAX_COUNT}")


def _start_instant(args: argparse.Namespace) -> datetime:
    """--from as UTC, or now."""
    if args.from_ is None:
        return utc_now().replace(microsecond=0)
    return parse_instant(args.from_, args.tz, field="from")


def _build_trigger(args: argparse.Namespace, start: datetime) -> Trigger:
    """Compile the rule the arguments describe."""
    if args.every is not None:
        anchor = parse_instant(args.anchor, args.tz, field="anchor") if args.anchor else start
        return compile_trigger(every=args.every, anchor=anchor, timezone=args.tz)
    return compile_trigger(cron=args.cron, at=args.at, timezone=args.tz,
                           dst_ambiguous=args.dst_ambiguous,
                           dst_nonexistent=args.dst_nonexistent)


def _table(rows: list[dict[str, str | None]], zone_name: str) -> str:
    """A plain aligned table with a header, a DST column when an instant is marked, and a
    legend line per mark shown (``mark: note``, the dashboard's words)."""
    if not rows:
        return "no upcoming instants"
    marked = any(row["dst"] for row in rows)
    headers = ("#", "UTC", f"local ({zone_name})", "DST")[: 4 if marked else 3]
    body, number = [], 0
    for row in rows:
        number += row["dst"] != "skipped"
        body.append(("-" if row["dst"] == "skipped" else str(number), str(row["utc"]),
                     str(row["local"]), row["dst"] or "")[: len(headers)])
    widths = [max(len(line[c]) for line in [headers, *body]) for c in range(len(headers))]
    lines = ["  ".join(cell.ljust(width)
                       for cell, width in zip(line, widths, strict=True)).rstrip()
             for line in [headers, *body]]
    legend = dict.fromkeys(f"{row['dst']}: {row['note']}" for row in rows if row["dst"])
    return "\n".join([*lines, *([""] if legend else []), *legend])


def run(args: argparse.Namespace) -> int:
    """Execute ``chronolog preview``."""
    _check_args(args)
    try:
        resolve_zone(args.tz)
        start = _start_instant(args)
        trigger = _build_trigger(args, start)
    except RecurrenceError as err:
        raise _usage_error(str(err)) from None
    rows = marked_rows(dst_marks(trigger, upcoming(trigger, start, args.n)),
                       resolve_zone(args.tz))
    if args.json:
        print(json.dumps({"instants": [row for row in rows if row["dst"] != "skipped"],
                          "skipped": [row for row in rows if row["dst"] == "skipped"]}))
    else:
        print(_table(rows, args.tz))
    return 0
