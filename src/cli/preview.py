"""``chronolog preview``: show the next instants a recurrence rule fires at.

    chronolog preview (--cron EXPR | --every DUR [--anchor ISO] | --at ISO)
                      [--tz ZONE] [--from ISO] [-n N] [--json]

Prints the next N (default 5) instants strictly after ``--from`` (default: now) as a table
with UTC and local columns, or with ``--json`` exactly
``{"instants": [{"utc": "...Z", "local": "...+hh:mm"}, ...]}`` (seconds precision).
``--every`` without ``--anchor`` is anchored at ``--from``. Naive ISO times are wall times
in ``--tz``. Bad input exits with status 2 and one line naming the field and value.
This is the only recurrence module allowed to read the clock (for the default ``--from``).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from chronolog.domain.recurrence import (
    RecurrenceError,
    Trigger,
    compile_trigger,
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
        description="Show the next N instants strictly after --from (default now).",
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
    return compile_trigger(cron=args.cron, at=args.at, timezone=args.tz)


def _rows(instants: list[datetime], zone_name: str) -> list[dict[str, str]]:
    """``{"utc": ..Z, "local": ..+hh:mm}`` per instant, seconds precision."""
    zone = resolve_zone(zone_name)
    return [
        {
            "utc": instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "local": instant.astimezone(zone).isoformat(timespec="seconds"),
        }
        for instant in instants
    ]


def _table(rows: list[dict[str, str]], zone_name: str) -> str:
    """A plain aligned table with a header."""
    if not rows:
        return "no upcoming instants"
    headers = ("#", "UTC", f"local ({zone_name})")
    body = [(str(i), row["utc"], row["local"]) for i, row in enumerate(rows, 1)]
    widths = [max(len(line[c]) for line in [headers, *body]) for c in range(3)]
    lines = ["  ".join(cell.ljust(width)
                       for cell, width in zip(line, widths, strict=True)).rstrip()
             for line in [headers, *body]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Execute ``chronolog preview``."""
    _check_args(args)
    try:
        resolve_zone(args.tz)
        start = _start_instant(args)
        trigger = _build_trigger(args, start)
    except RecurrenceError as err:
        raise _usage_error(str(err)) from None
    rows = _rows(upcoming(trigger, start, args.n), args.tz)
    if args.json:
        print(json.dumps({"instants": rows}))
    else:
        print(_table(rows, args.tz))
    return 0
