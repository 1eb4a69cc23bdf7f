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

from chronolog.cli.errors import UsageError, argparse_line, error_line, set_flags
from chronolog.environment import package_version
from chronolog.log.port import LogUnsafe

# The module that adds each sub-command (each module defines register(subparsers)), in the
# order `chronolog --help` lists them. `chronolog <command> ...` imports only its command's
# module: the drivers and the read model of the others (aiokafka, asyncpg, FastAPI, ...) cost
# most of a second to import, paid by every invocation of a script. Help without a command,
# an unknown command and shell completion build the whole parser.
COMMANDS: dict[str, str] = {
    "preview": "chronolog.cli.preview",
    "audit": "chronolog.cli.audit",
    "archive": "chronolog.cli.archive",
    "replay": "chronolog.cli.replay",
    "projector": "chronolog.cli.projector",
    "api": "chronolog.cli.api",
    "processor": "chronolog.cli.processor",
    "dev": "chronolog.cli.dev",
    "worker": "chronolog.cli.worker",
    "gc": "chronolog.cli.worker",
    "effects": "chronolog.cli.effects",
    "reconcile": "chronolog.cli.effects",
    "apply": "chronolog.cli.apply",
    "schedule": "chronolog.cli.schedules",
    "calendar": "chronolog.cli.schedules",
    "trigger": "chronolog.cli.schedules",
    "cancel": "chronolog.cli.schedules",
    "redrive": "chronolog.cli.schedules",
    "runs": "chronolog.cli.schedules",
    "run": "chronolog.cli.schedules",
    "workers": "chronolog.cli.schedules",
    "dlq": "chronolog.cli.dlq",
    "rules": "chronolog.cli.rules",
    "backup": "chronolog.cli.backup",
    "restore": "chronolog.cli.backup",
    "repartition": "chronolog.cli.repartition",
    "kafka-acls": "chronolog.cli.kafka_acls",
}
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # one line naming the argument, as every other usage error (not argparse's usage)
        print(argparse_line(message), file=sys.stderr)
        raise SystemExit(2)


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The command line with the sub-commands of ``modules`` (all by default)."""
    parser = _Parser(prog="chronolog", description="Event-sourced job scheduler.")
    parser.add_argument("--version", action="version", version=f"chronolog {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def modules_for(argv: Sequence[str]) -> Sequence[str]:
    """The command modules a parse of ``argv`` needs: the named command's alone, or all of
    them (no command, an option first, an unknown command, or the shell asking for
    completions)."""
    if argv and argv[0] in COMMANDS and "_ARGCOMPLETE" not in os.environ:
        return (COMMANDS[argv[0]],)
    return COMMAND_MODULES


def _flags_of(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The options of the (sub)command ``argv`` runs: its parser's and its parents'."""
    flags: set[str] = set()
    rest = list(argv)
    current: argparse.ArgumentParser | None = parser
    while current is not None:
        chosen = None
        for action in current._actions:
            flags.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                name = next((a for a in rest if a in action.choices), None)
                if name is not None:
                    rest = rest[rest.index(name) + 1:]
                    chosen = action.choices[name]
        current = chosen
    return flags


def main(argv: Sequence[str] | None = None) -> int:
    from chronolog.log.datadir import private_umask

    private_umask()  # whatever chronolog creates (log, results, backups, secrets): owner only
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(modules_for(argv))
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (then it exits)
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    set_flags(_flags_of(parser, argv))
    try:
        rc = args.func(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except LogUnsafe as exc:  # a log that cannot keep the guarantees: refused, as bad config
        print(error_line(str(exc)), file=sys.stderr)
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
