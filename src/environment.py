"""The imperative shell's clock and identity source.

The pure core (``chronolog.domain``, the decider in ``chronolog.commands``) never reads a
clock or draws randomness: time enters as ``now`` and identities derive from their inputs.
Processes that do need the wall clock or fresh IDs (the processor, the command client, the
CLI) take them from here, as injectable defaults.
"""

from __future__ import annotations

import gc
import uuid
from datetime import UTC, datetime


def utc_now() -> datetime:
    """The wall clock in UTC (the processor's authority time)."""
    return datetime.now(UTC)


def new_id() -> str:
    """A fresh random identifier (command IDs, client IDs)."""
    return uuid.uuid4().hex


def gc_tune(gen0: int) -> None:
    """Raise the gen-0 GC threshold while at least one long-running loop (processor,
    projector) runs: their batches allocate many short-lived objects, and collections
    were 30-40 % of a processor's CPU. Process-wide, reference-counted."""
    global _GC_SAVED, _GC_USERS
    if _GC_USERS == 0:
        _GC_SAVED = gc.get_threshold()
        if _GC_SAVED[0] < gen0:
            gc.set_threshold(gen0, *_GC_SAVED[1:])
    _GC_USERS += 1


def gc_untune() -> None:
    """Undo one ``gc_tune`` (the thresholds come back when the last user leaves)."""
    global _GC_SAVED, _GC_USERS
    _GC_USERS -= 1
    if _GC_USERS == 0 and _GC_SAVED is not None:
        gc.set_threshold(*_GC_SAVED)
        _GC_SAVED = None


def gc_tuned() -> bool:
    """True while some loop holds a ``gc_tune``."""
    return _GC_USERS > 0


_GC_SAVED: tuple[int, ...] | None = None
_GC_USERS = 0
