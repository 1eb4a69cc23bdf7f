"""``chronolog dlq list``: the records consumers skipped, with the reason.

``chronolog dlq list [--log URL | --data-dir DIR] [--partitions N] [--topic-prefix P]
[--consumer NAME] [--topic TOPIC] [--limit N] [--json]`` prints every dead letter of the
``dlq`` topic (chronolog.log.dead_letters), oldest first: when, which consumer skipped which
record (topic[partition]@offset), the error's class and message, the command ID when the
record was a command. ``--consumer`` keeps one consumer's letters (``processor``,
``projector``, ``effects``, ``worker``, ``client:<id>``; a trailing ``*`` matches a prefix),
``--topic`` one source topic (full name, or the name after the prefix: ``events``),
``--limit N`` the newest N. ``--json`` prints a JSON array of the letters as stored
(``original`` is the record's bytes, base64). Exit 0, also when there are none; 2 on bad
flags.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from chronolog.cli.flags import add_log_flags, log_from_args


def register(sub: Any) -> None:
    d = sub.add_parser("dlq", help="records consumers skipped (dead letters), with the reason")
    dsub = d.add_subparsers(dest="dlq_command", metavar="ACTION")
    dsub.required = True
    lp = dsub.add_parser("list", help="list dead letters, oldest first")
    add_log_flags(lp)
    lp.add_argument("--consumer", default=None, metavar="NAME",
                    help="only this consumer's (processor, projector, effects, worker, "
                    "client:ID; NAME* for a prefix)")
    lp.add_argument("--topic", default=None, metavar="TOPIC",
                    help="only records of this topic (full name, or e.g. 'events')")
    lp.add_argument("--limit", type=int, default=None, metavar="N", help="only the newest N")
    lp.add_argument("--json", action="store_true", help="print a JSON array")
    lp.set_defaults(func=_run_list)


def _run_list(args: Any) -> int:
    from chronolog.cli.errors import UsageError

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"invalid --limit '{args.limit}': must be at least 1")
    return asyncio.run(_list(log_from_args(args), args))


def _matches(value: str, pattern: str | None) -> bool:
    if pattern is None:
        return True
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return value == pattern


async def _list(log_: Any, args: Any) -> int:
    from chronolog.log.dead_letters import read_dead_letters

    topic = args.topic
    if topic is not None and not topic.startswith(log_.topics.prefix):
        topic = f"{log_.topics.prefix}{topic}"
    await log_.start()
    try:
        await log_.ensure_topics()
        letters = await read_dead_letters(
            log_, lambda d: _matches(d.consumer, args.consumer) and _matches(d.source_topic, topic))
    finally:
        await log_.close()
    if args.limit is not None:
        letters = letters[-args.limit:]
    if args.json:
        print(orjson.dumps([d.model_dump(mode="json") for d in letters],
                           option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(_lines(letters)) if letters else "no dead letters")
    return 0


def _lines(letters: list[Any]) -> list[str]:
    """Two lines per letter: when, who, which record, its size; the error."""
    out = []
    for d in letters:
        at = d.dead_lettered_at.isoformat().replace("+00:00", "Z") if d.dead_lettered_at else "-"
        cid = f" command={d.command_id}" if d.command_id else ""
        size = d.original_size if d.original_size is not None else "?"
        out.append(f"{at}  {d.consumer}  {d.source_topic}[{d.source_partition}]@"
                   f"{d.source_offset}  {size} bytes{cid}")
        out.append(f"    {d.error_class}: {d.reason}")
    return out
