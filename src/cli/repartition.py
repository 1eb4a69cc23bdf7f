"""``chronolog repartition --to P``: change the partition count of a running deployment.

    chronolog repartition --to P [--log URL | --data-dir DIR] [--timeout SECONDS]

The change is made by the partitions' owners themselves (docs/design.md §18); this command
only drives it, and every step it takes is on the log, so it can be stopped at any point and
run again with the same ``--to P`` to go on from where it was:

1. the routing history (``chronolog.log.routing_history``) gets version 1 — the count the
   deployment has — if it has no record yet, then version v+1 with P partitions, *begun*
   (a change to another count already under way is refused: finish it first);
2. every topic whose partition p belongs with partition p of ``commands`` (commands,
   events, state, replies, every ``ready.<class>``: ``Topics.follows_processors``) grows to
   P partitions; running processes are assigned the new partitions within seconds;
3. each partition of the version served until now is sent ``BeginHandover``: its owner
   moves every key whose home changes — state, pending runs, request keys, fence — to the
   new home in one transaction and tells every partition of the new version. The command's
   reply says the partition has handed over (a repeated one answers the same, changing
   nothing). Progress is printed as the replies come;
4. once every partition has handed over, version v+1 is recorded *complete*: clients
   route by it.

P can only grow (a Kafka topic never loses partitions). Exit status: 0 done (or nothing to
do); 1 some partitions did not hand over within ``--timeout`` (no processor running?) —
run the command again to go on; 2 bad input, one line on stderr naming it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from chronolog.cli.errors import UsageError
from chronolog.cli.log_reader import add_log_arguments, log_config, open_existing_log
from chronolog.client import Client
from chronolog.commands.aggregate import PROCESSOR
from chronolog.domain import messages as m
from chronolog.domain.ids import ROUTING_ID, ROUTING_TENANT
from chronolog.domain.routing import RoutingChange, RoutingTable
from chronolog.environment import new_id
from chronolog.log.port import EventLog
from chronolog.log.routing_history import append_change, read_history, read_routing
from chronolog.settings import MAX_PARTITIONS

DEFAULT_TIMEOUT_S = 600.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "repartition", help="change the partition count of a running deployment",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The change can be stopped at any point and resumed by running the same "
               "command again (docs/design.md §18).")
    p.add_argument("--to", dest="to", required=True, type=int, metavar="P",
                   help=f"the new partition count, larger than the current one "
                        f"(at most {MAX_PARTITIONS})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"how long to wait for the partitions to hand over "
                        f"(default {DEFAULT_TIMEOUT_S:.0f})")
    add_log_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.to <= MAX_PARTITIONS:
        raise UsageError(f"invalid to '{args.to}': the partition count must be 1.."
                         f"{MAX_PARTITIONS}")
    if not 0 < args.timeout <= 86_400:
        raise UsageError(f"invalid timeout '{args.timeout}': must be 0 < SECONDS <= 86400")
    cfg = log_config(args)
    return asyncio.run(_main(cfg, args.to, args.timeout))


async def _main(cfg: Any, to: int, timeout: float) -> int:
    log = await open_existing_log(cfg)
    try:
        return await repartition(log, to, timeout, say)
    finally:
        await log.close()


def say(line: str) -> None:
    print(line, flush=True)


async def repartition(log: EventLog, to: int, timeout: float, progress: Any = say) -> int:
    """Drive the change to ``to`` partitions (the module docstring); the exit status."""
    table = await _begun(log, to, progress)
    if table is None:
        return 0
    migrating = table.migrating
    assert migrating is not None
    await _grow_topics(log, to, progress)
    old = table.current
    pending = await _hand_over(log, table, timeout, progress)
    if pending:
        print(f"chronolog repartition: partitions {pending} of version {old.version} have "
              f"not handed over within {timeout:g} s (is a processor running?); run the "
              "same command again to go on", file=sys.stderr)
        return 1
    done = await append_change(log, RoutingChange(migrating.version, to, True))
    if done.active != migrating.version:  # pragma: no cover - only this change is under way
        raise UsageError(f"invalid to '{to}': the routing history did not complete version "
                         f"{migrating.version}")
    progress(f"version {migrating.version} complete: clients route by {to} partitions")
    return 0


async def _begun(log: EventLog, to: int, progress: Any) -> RoutingTable | None:
    """The routing table with the change to ``to`` begun (None: the deployment has ``to``
    partitions already and no change is under way)."""
    if not await read_history(log):
        count = await log.partitions_for(log.topics.commands)
        await append_change(log, RoutingChange(1, count, True))
    table = await read_routing(log)
    migrating = table.migrating
    current = table.current
    if migrating is None:
        if to == current.partitions:
            progress(f"the deployment has {to} partitions (version {current.version}): "
                     "nothing to do")
            return None
        if to < current.partitions:
            raise UsageError(f"invalid to '{to}': the partition count can only grow (it is "
                             f"{current.partitions}; a topic never loses partitions)")
        table = await append_change(log, RoutingChange(current.version + 1, to, False))
        migrating = table.migrating
        if migrating is None or migrating.partitions != to:
            raise UsageError(f"invalid to '{to}': another change began at the same time "
                             f"({'none' if migrating is None else migrating.partitions} "
                             "partitions)")
        progress(f"version {migrating.version} begun: {current.partitions} -> {to} "
                 "partitions")
    elif migrating.partitions != to:
        raise UsageError(f"invalid to '{to}': a change to {migrating.partitions} partitions "
                         f"(version {migrating.version}) is under way; finish it first with "
                         f"--to {migrating.partitions}")
    else:
        progress(f"version {migrating.version} under way: {current.partitions} -> {to} "
                 "partitions (going on)")
    return table


async def _grow_topics(log: EventLog, to: int, progress: Any) -> None:
    grown = []
    for topic, n in (await log.prefixed_topics()).items():
        if log.topics.follows_processors(topic) and n < to:
            await log.add_partitions(topic, to)
            grown.append(topic[len(log.topics.prefix):])
    if grown:
        progress(f"topics grown to {to} partitions: {', '.join(grown)}")


async def _hand_over(log: EventLog, table: RoutingTable, timeout: float,
                     progress: Any) -> list[int]:
    """Send every partition of the version served until now ``BeginHandover`` and wait for
    their replies; the partitions that did not answer ``ok`` in time."""
    migrating = table.migrating
    assert migrating is not None
    partitions = tuple(v.partitions for v in table.versions)
    old = table.current.partitions
    client = Client(log, principal=PROCESSOR, reply_timeout=timeout)
    await client.start()
    try:
        futures: dict[int, asyncio.Future[m.Reply]] = {}
        envs: dict[int, m.CommandEnvelope] = {}
        for p in range(old):
            env = client.envelope(ROUTING_TENANT, ROUTING_ID, m.BeginHandover(
                partitions=partitions, to_version=migrating.version),
                command_id=f"repartition-{migrating.version}-{p}-{new_id()}")
            [futures[p]] = await client.submit([env], partition=p)
            envs[p] = env
        deadline = time.monotonic() + timeout
        done = 0
        left = dict(futures)
        while left:
            finished, _ = await asyncio.wait(left.values(), timeout=max(
                0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED)
            if not finished:
                break
            for p, fut in list(left.items()):
                if fut not in finished:
                    continue
                del left[p]
                if fut.cancelled() or fut.exception() is not None:
                    left[p] = fut  # a reply that does not decode: as if lost (run again)
                    continue
                reply = fut.result()
                if reply.status != "ok":
                    raise UsageError(f"invalid to '{migrating.partitions}': partition {p} "
                                     f"refused the handover: {reply.status}: {reply.reason}")
                done += 1
                progress(f"partition {p} handed over to version {migrating.version} "
                         f"({done} of {old})")
        await client.collect(list(envs.values()), list(futures.values()), 0)
        return sorted(left)
    finally:
        await client.close()
