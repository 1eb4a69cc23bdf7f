"""Deterministic identities: partition keys, run IDs, effect IDs and event IDs.

Nothing here draws on chance: a run ID is a hash of the occurrence key, so the same occurrence
gets the same ID on every processor, in every replay, for the life of the schedule.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime


def partition_key(tenant: str, schedule_id: str) -> str:
    """The log key of a schedule aggregate: ``tenant/schedule_id``."""
    return f"{tenant}/{schedule_id}"


# the schedule ID of a tenant's quota aggregate (its key is ``partition_key(tenant, QUOTA_ID)``);
# a schedule may not take it
QUOTA_ID = "@quota"


# the schedule IDs of a tenant's concurrency keys: ``limit_id(key)`` (the rendered key's
# digest: any key, a bounded ID); decided like the quota (``chronolog.commands.permits``)
LIMIT_PREFIX = "@limit:"


def limit_id(key: str) -> str:
    """The schedule ID of the aggregate that grants the permits of concurrency key ``key``."""
    return LIMIT_PREFIX + _digest(key)


# the schedule IDs of a tenant's calendars: ``calendar_id(name)`` (a calendar's name is a
# bounded, plain name); decided like the quota (``chronolog.commands.calendars``)
CALENDAR_PREFIX = "@calendar:"


def calendar_id(name: str) -> str:
    """The schedule ID of the aggregate that holds calendar ``name`` of a tenant."""
    return CALENDAR_PREFIX + name


def is_quota_id(schedule_id: str) -> bool:
    """A tenant's quota, one of its concurrency keys or one of its calendars (all three the
    quota aggregate's kind)."""
    return (schedule_id == QUOTA_ID or schedule_id.startswith((LIMIT_PREFIX, CALENDAR_PREFIX)))


def quota_key(tenant: str) -> str:
    """The log key of a tenant's quota aggregate (one partition decides all its slots)."""
    return partition_key(tenant, QUOTA_ID)


# the routing view of a partition (docs/design.md §18) is an aggregate of its own on every
# partition, keyed ``routing_key()``: its commands and events name this tenant and schedule ID
# and are addressed to a partition, not placed by their key's hash
ROUTING_TENANT = "_chronolog"
ROUTING_ID = "@routing"


def routing_key() -> str:
    """The log key of a partition's routing view (the same on every partition)."""
    return partition_key(ROUTING_TENANT, ROUTING_ID)


def move_command_id(side: str, version: int, key: str) -> str:
    """The command ID of a key's move to routing ``version`` (``side``: "out", the handover's
    decision on the old home; "in", the adopt command to the new home): one per key and
    version, so the events of the two sides never share an ID."""
    return f"move:{side}:{version}:{_digest(key)}"


def saga_command_id(kind: str, create_command_id: str) -> str:
    """The command ID of a quota saga step for one create (deterministic, bounded length)."""
    return f"quota:{kind}:{_digest(create_command_id)}"


def iso_utc(instant: datetime) -> str:
    """ISO-8601 UTC with a ``Z`` suffix, seconds precision unless sub-second is set."""
    s = instant.astimezone(UTC).isoformat()
    return s.replace("+00:00", "Z")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def run_id_for(tenant: str, schedule_id: str, scheduled_at: datetime) -> str:
    """The run ID of the occurrence ``(schedule_id, scheduled_at)`` of a tenant."""
    return "r_" + _digest(f"{tenant}/{schedule_id}@{iso_utc(scheduled_at)}")


BACKFILL_RUN = "b_"  # the prefix of a backfill's run IDs


def backfill_run_id(tenant: str, schedule_id: str, instant: datetime) -> str:
    """The run ID of a backfill's run of ``instant``: one per instant of the schedule, so a
    backfill never runs an instant twice (``b_`` marks it: no scheduled or manual run's)."""
    return BACKFILL_RUN + _digest(f"{tenant}/{schedule_id}#backfill@{iso_utc(instant)}")


def manual_run_id(tenant: str, schedule_id: str, request_key: str,
                  first_use: str | None = None) -> str:
    """The run ID of a manual trigger: a hash of ``(schedule_id, request_key)`` and
    ``first_use``, which names the decision that first used the key (its command ID and
    authority time). A key is remembered for the schedule's last ``MANUAL_KEYS_KEPT``
    manual triggers (``commands.state``), and within that window the same key answers the
    same run; a key reused after it starts a new run, whose ID ``first_use`` keeps distinct
    from the forgotten one's. (Runs triggered before ``first_use`` was part of the hash keep
    the IDs they were recorded with: their events carry them.)"""
    tail = f"#{first_use}" if first_use is not None else ""
    return "m_" + _digest(f"{tenant}/{schedule_id}#manual#{request_key}{tail}")


def effect_id_for(name: str, run_id: str) -> str:
    """A stable effect identity such as ``send-<run_id>``."""
    return f"{name}-{run_id}"


def event_id_for(command_id: str, index: int) -> str:
    """Event IDs derive from the causing command, so a re-decided command repeats them."""
    return f"{command_id}.{index}"
