"""``chronolog kafka-acls``: the Kafka ACLs of a role's principal, printed or applied.

    chronolog kafka-acls --role ROLE --principal User:NAME [--pool P] [--topic-prefix P]
                         [--table] [--apply --log kafka://HOST:PORT]

Prints one ``kafka-acls.sh`` command line per ACL (``--table``: a table) for the role
(``chronolog.log.kafka_acls``: processor, projector, api, effects, worker, reader,
operator; ``--pool`` for a worker of a pool). ``--apply`` creates them on the cluster of
``--log`` (env ``CHRONOLOG_LOG``) through the admin API, as the principal of
``CHRONOLOG_KAFKA_SASL_USERNAME`` (one allowed to alter ACLs: the cluster's super user).
Exit status 2 on a bad role, principal or pool (naming it), 1 when the broker refuses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from chronolog.cli.errors import UsageError
from chronolog.log.kafka_acls import ROLES, AclError, acls_for, apply_acls
from chronolog.log.port import Topics
from chronolog.settings import ConfigError, parse_log_url
from chronolog.wakeup import wait_within


def register(sub: Any) -> None:
    p = sub.add_parser("kafka-acls", help="the Kafka ACLs of a role's principal (print/apply)")
    p.add_argument("--role", required=True, help="one of " + ", ".join(ROLES))
    p.add_argument("--principal", required=True, metavar="User:NAME",
                   help="the principal, e.g. User:worker-a")
    p.add_argument("--pool", default=None, help="a worker's pool")
    p.add_argument("--topic-prefix", default=None,
                   help="topic prefix (env CHRONOLOG_TOPIC_PREFIX, default chronolog.)")
    p.add_argument("--table", action="store_true", help="a table instead of command lines")
    p.add_argument("--apply", action="store_true", help="create them on the cluster of --log")
    p.add_argument("--log", default=None, help="kafka://host:port (env CHRONOLOG_LOG)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    prefix = args.topic_prefix or os.environ.get("CHRONOLOG_TOPIC_PREFIX", "chronolog.")
    try:
        acls = acls_for(args.role, args.principal, Topics(prefix=prefix), args.pool)
    except AclError as exc:
        raise UsageError(str(exc)) from None
    cfg = None
    if args.apply:
        try:
            cfg = parse_log_url(args.log or os.environ.get("CHRONOLOG_LOG") or "-", prefix=prefix)
        except ConfigError as exc:
            raise UsageError(f"--apply needs --log kafka://HOST:PORT: {exc}") from None
        if cfg.kind != "kafka":
            raise UsageError(f"invalid --log '{args.log}': --apply needs kafka://HOST:PORT")
    bootstrap = cfg.target if cfg is not None else "BOOTSTRAP"
    for acl in acls:
        print(acl.row() if args.table else acl.kafka_acls_line(bootstrap))
    if cfg is None:
        return 0
    from aiokafka.admin import AIOKafkaAdminClient

    async def apply() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=cfg.target, client_id="chronolog-acls",
                                    request_timeout_ms=15000, **cfg.auth.client_kwargs())
        await wait_within(admin.start(), 30)
        try:
            await wait_within(apply_acls(admin, acls), 60)
        finally:
            await admin.close()

    try:
        asyncio.run(apply())
    except AclError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"applied {len(acls)} ACLs for {args.principal}")
    return 0
