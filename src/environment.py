"""The imperative shell's clock and identity source.

The pure core (``chronolog.domain``, the decider in ``chronolog.commands``) never reads a
clock or draws randomness: time enters as ``now`` and identities derive from their inputs.
Processes that do need the wall clock or fresh IDs (the processor, the command client, the
CLI) take them from here, as injectable defaults.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def package_version() -> str:
    """The installed distribution's version (``unknown`` when it is not installed): what
    ``chronolog --version`` prints and the OpenAPI document's ``info.version``."""
    try:
        return version("chronolog")
    except PackageNotFoundError:
        return "unknown"


def utc_now() -> datetime:
    """The wall clock in UTC (the processor's authority time)."""
    return datetime.now(UTC)


def uptime() -> float:
    """Seconds on a clock nobody can set, the same for every process of this machine:
    ``CLOCK_BOOTTIME`` where there is one (it counts a suspended host's sleep, which the wall
    clock counts too), else ``time.monotonic``. It starts again at each boot (``boot_id``)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic()
    return time.clock_gettime(boottime)


def boot_id() -> str:
    """This boot of this machine (Linux: ``/proc/sys/kernel/random/boot_id``): ``uptime``
    readings compare only within one boot. Elsewhere the process's own ID: no reading is
    trusted beyond the process that took it."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"process-{os.getpid()}"


class _IdPool(threading.local):
    """Random hex drawn from the OS in blocks, per thread: a worker asks for an ID per run
    it reports, and one ``os.urandom`` call per ID (``uuid4``) was a measurable part of a
    run's CPU. Dropped in a forked child, which must not hand out its parent's IDs."""

    hex = ""
    at = 0


_ID_HEX = 32  # 128 random bits, the length of ``uuid4().hex``
_IDS_PER_DRAW = 128
_pool = _IdPool()


def _forget_pool() -> None:
    _pool.hex, _pool.at = "", 0


os.register_at_fork(after_in_child=_forget_pool)


def new_id() -> str:
    """A fresh random identifier (command IDs, client IDs): 32 hex digits, 128 bits from
    the OS's random source."""
    pool = _pool
    at = pool.at
    if at >= len(pool.hex):
        pool.hex, at = os.urandom(_ID_HEX // 2 * _IDS_PER_DRAW).hex(), 0
    pool.at = at + _ID_HEX
    return pool.hex[at:at + _ID_HEX]


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
_GC_PAUSES = 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside (process-wide, reference-counted; collection comes
    back when the last user leaves, if it was on). For a processor's restore: it builds
    100,000s of long-lived objects, and the collections the allocations trigger then
    traverse them again and again — measured 4x the time of decoding a snapshot; freed
    temporaries go by reference counting all the same."""
    global _GC_PAUSES, _GC_WAS_ON
    if _GC_PAUSES == 0:
        _GC_WAS_ON = gc.isenabled()
        gc.disable()
    _GC_PAUSES += 1
    try:
        yield
    finally:
        _GC_PAUSES -= 1
        if _GC_PAUSES == 0 and _GC_WAS_ON:
            gc.enable()


_GC_WAS_ON = True


def tzdata_in_use(probe: str = "UTC") -> tuple[str, str]:
    """The time-zone database ``zoneinfo`` reads: ``(version, source)``.

    ``zoneinfo`` looks a zone up in each directory of ``zoneinfo.TZPATH`` (the system's, or
    ``PYTHONTZPATH``) and falls back to the ``tzdata`` package. The source is the first
    directory holding ``probe``; its version is the ``# version`` line of its ``tzdata.zi``
    (Debian, Alpine, ...) or its ``+VERSION`` file, else ``unknown``. Without such a
    directory: the ``tzdata`` package's ``IANA_VERSION`` (source ``tzdata-package``)."""
    for root in zoneinfo.TZPATH:
        base = Path(root)
        if not (base / probe).is_file():
            continue
        for name in ("tzdata.zi", "+VERSION"):
            try:
                with open(base / name, encoding="utf-8", errors="replace") as fh:
                    first = fh.readline().strip()
            except OSError:
                continue
            version = first.removeprefix("# version").strip()
            if version:
                return version, str(base)
        return "unknown", str(base)
    try:
        import tzdata  # type: ignore[import-untyped]
    except ImportError:
        return "none", "none"
    return str(getattr(tzdata, "IANA_VERSION", "unknown")), "tzdata-package"
