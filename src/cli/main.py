"""The ``chronolog`` command line.

Each sub-command lives in its own module exposing ``register(subparsers)``; this module only
assembles them. Errors in user input exit with status 2 and one line on stderr naming the
field and the bad value; no traceback is printed for them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from chronolog.cli.errors import UsageError

# Modules that add sub-commands (each defines register(subparsers)).
COMMAND_MODULES: tuple[str, ...] = (
    "chronolog.cli.preview",
    "chronolog.cli.audit",
    "chronolog.cli.replay",
    "chronolog.cli.projector",
    "chronolog.cli.api",
    "chronolog.cli.processor",
    "chronolog.cli.dev",
    "chronolog.cli.worker",
    "chronolog.cli.effects",
    "chronolog.cli.schedules",
    "chronolog.cli.dlq",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="chronolog", description="Event-sourced job scheduler.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
