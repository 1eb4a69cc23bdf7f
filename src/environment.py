"""The imperative shell's clock and identity source.

The pure core (``chronolog.domain``, the decider in ``chronolog.commands``) never reads a
clock or draws randomness: time enters as ``now`` and identities derive from their inputs.
Processes that do need the wall clock or fresh IDs (the processor, the command client, the
CLI) take them from here, as injectable defaults.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone


def utc_now() -> datetime:
    """The wall clock in UTC (the processor's authority time)."""
    return datetime.now(timezone.utc)


def new_id() -> str:
    """A fresh random identifier (command IDs, client IDs)."""
    return uuid.uuid4().hex
