# PYTHON_ARGCOMPLETE_OK
"""The ``chronolog`` command line.

Each sub-command lives in its own module exposing ``register(subparsers)``; this module only
assembles them. Errors in user input exit with status 2 and one line on stderr naming the
field and the bad value; no traceback is printed for them. ``chronolog --version`` prints
``chronolog <version>`` (the installed package's). Shell completion of sub-commands and
flags comes from argcomplete: ``eval "$(register-python-argcomplete chronolog)"``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import argcomplete

from chronolog.cli.errors import UsageError
from chronolog.log.port import LogUnsafe

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
    "chronolog.cli.rules",
    "chronolog.cli.backup",
    "chronolog.cli.repartition",
    "chronolog.cli.kafka_acls",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def package_version() -> str:
    """The installed distribution's version (``unknown`` when it is not installed)."""
    try:
        return version("chronolog")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="chronolog", description="Event-sourced job scheduler.")
    parser.add_argument("--version", action="version", version=f"chronolog {package_version()}")
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
    from chronolog.log.datadir import private_umask

    private_umask()  # whatever chronolog creates (log, results, backups, secrets): owner only
    parser = build_parser()
    argcomplete.autocomplete(parser)  # only when the shell asks for completions (then exits)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except LogUnsafe as exc:  # a log that cannot keep the guarantees: refused, as bad config
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`chronolog runs --json | head`)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
