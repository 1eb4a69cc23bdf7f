"""``chronolog archive verify DIR``: check a whole archive of the event log (docs/design.md
§19, ``chronolog.archive.verify``).

    chronolog archive verify DIR [--json]

* a clean archive: one summary line (``archive ok: ...``), exit 0;
* problems: each on its own line, ``PROBLEM <kind>: <partition> <segment> <detail>``, then
  the summary line, exit 1;
* bad input (no such directory, not an archive): one line on stderr, exit 2.

``--json`` prints the report as one JSON object instead (same exit statuses).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from chronolog.archive import NotAnArchive, verify
from chronolog.cli.errors import UsageError


def register(subparsers: Any) -> None:
    """Add the ``archive`` sub-command to the ``chronolog`` parser."""
    parser = subparsers.add_parser(
        "archive",
        help="check an archive of the event log",
        description="The archive of pruned events: segment files per partition, listed by "
                    "a hash-chained manifest.",
    )
    sub = parser.add_subparsers(dest="archive_command", metavar="SUBCOMMAND", required=True)
    check = sub.add_parser(
        "verify",
        help="check every segment, checksum, hash-chain link and range of an archive",
        description="Check that every manifest entry's segment exists and matches its "
                    "SHA-256, the hash chain holds and each partition's segments are "
                    "contiguous and in order. Exit 0: clean; 1: problems; 2: bad input.",
    )
    check.add_argument("directory", metavar="DIR", help="the archive directory")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    """Execute ``chronolog archive verify``."""
    try:
        report = verify(Path(args.directory))
    except NotAnArchive as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        for problem in report.problems:
            print(problem.line())
        print(report.summary())
    return 0 if report.ok else 1
