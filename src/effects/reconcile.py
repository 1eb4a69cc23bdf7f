"""Reconciliation views: which runs wait for an operator, with their evidence (a log fold).

A run is *reconciling* from a ReconciliationRequired event until a ReconciliationResolved
event for the same run. ``open_reconciliations`` folds every partition of ``events`` and
returns the open ones, oldest first, each with its reason and evidence (for an effect: the
intent's kind, delivery attempt and redacted config, and the adapter's evidence such as the
SMTP phase reached or the HTTP tries). It reads the log, not the read model, so it works
without PostgreSQL and is never behind.

Resolving is a command (``ResolveReconciliation``) sent through the ``Client``; the processor
records ReconciliationResolved with the principal (who) and the note (why).
"""

from __future__ import annotations

import re
from typing import Any

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import iso_utc
from chronolog.log.port import EventLog
from chronolog.log.reading import read_partition

_SECRET = re.compile(r"pass|secret|token|auth|dsn|key", re.IGNORECASE)


def redact(config: dict[str, Any]) -> dict[str, Any]:
    """The config with secret-looking values replaced by ``***``."""
    return {k: ("***" if _SECRET.search(k) else v) for k, v in config.items()}


async def open_reconciliations(log_: EventLog) -> list[dict[str, Any]]:
    """Runs in RECONCILING (ReconciliationRequired not yet resolved), oldest first."""
    topic = log_.topics.events
    open_: dict[tuple[str, str, str], dict[str, Any]] = {}
    intents: dict[tuple[str, str, str], m.EffectIntended] = {}
    for p in range(await log_.partitions_for(topic)):
        async for recs in read_partition(log_, topic, p):
            for rec in recs:
                env = codec.decode_event(rec.value)
                ev = env.payload
                if isinstance(ev, m.EffectIntended):
                    intents[(env.tenant, env.schedule_id, ev.effect_id)] = ev
                elif isinstance(ev, m.ReconciliationRequired):
                    item: dict[str, Any] = {
                        "run_id": ev.run_id, "tenant": env.tenant,
                        "schedule_id": env.schedule_id, "effect_id": ev.effect_id,
                        "reason": ev.reason, "since": iso_utc(env.at),
                        "evidence": ev.evidence, "position": f"{topic}/{p}@{rec.offset}",
                    }
                    intent = intents.get((env.tenant, env.schedule_id, ev.effect_id or ""))
                    if intent is not None:
                        item.update(kind=intent.kind, effect_attempt=intent.attempt,
                                    config=redact(intent.config))
                    open_[(env.tenant, env.schedule_id, ev.run_id)] = item
                elif isinstance(ev, m.ReconciliationResolved):
                    open_.pop((env.tenant, env.schedule_id, ev.run_id), None)
    return sorted(open_.values(), key=lambda i: (i["since"], i["run_id"]))
