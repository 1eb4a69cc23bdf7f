"""Kafka's default partitioner: ``partition_for`` (and aiokafka's ``murmur2``, re-exported);
Kafka's range assignor of a group's partitions, for the logs that assign them themselves:
``range_assign``.

Both log backends place a keyed record on ``(murmur2(key) & 0x7fffffff) % n`` — exactly what
the Java client's ``Utils.toPositive(Utils.murmur2(key)) % numPartitions`` and aiokafka's
``DefaultPartitioner`` do — so a key lands on the same partition in SQLite and in Kafka.
The hash is Kafka's ``murmur2``: an *unsigned* 32-bit integer; Java's ``int`` result is the
signed view of the same 32 bits, and ``& 0x7fffffff`` gives the same value for both. It is
written out here rather than taken from aiokafka (whose ``murmur2`` is the same pure Python):
importing ``aiokafka.partitioner`` imports the whole client, about 60 ms of the start of
every process and CLI call, and most of them (the embedded log, the CLI, the API) place keys
without ever talking to Kafka. ``tests/unit/test_partitioner.py`` pins the values on many
keys and checks this function against aiokafka's on arbitrary bytes, so a change of the
hash that would move existing records fails there.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["key_hash", "misplaced", "murmur2", "partition_for", "range_assign"]

_SEED = 0x9747B28C
_M = 0x5BD1E995  # the mixing constant of MurmurHash2
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 (seed 0x9747b28c) of ``data``, as Kafka's ``Utils.murmur2`` computes it;
    unsigned 32-bit (Java's ``>>>`` is ``>>`` on the unsigned value)."""
    length = len(data)
    h = _SEED ^ length
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    extra = length - whole
    if extra >= 3:
        h ^= data[whole + 2] << 16
    if extra >= 2:
        h ^= data[whole + 1] << 8
    if extra >= 1:
        h = ((h ^ data[whole]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


@lru_cache(maxsize=1 << 16)
def partition_for(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``num_partitions``.

    Cached: the hash is pure Python and reads four bytes at a time, and a schedule's key
    is placed again for every command of its runs (create, claim, complete, ...)."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


@lru_cache(maxsize=1 << 16)
def key_hash(key: bytes) -> int:
    """The key's positive murmur2 hash: its partition among n is ``key_hash(key) % n`` (the
    routing versions of ``chronolog.domain.routing`` place keys by it)."""
    return murmur2(key) & 0x7FFFFFFF


def misplaced(record_key: bytes | None, key: str, partition: int, num_partitions: int | None
              ) -> str | None:
    """Why a record that belongs under ``key`` may not be decided on ``partition`` (None: it
    may). Its record key must be ``key`` and its partition the one ``partition_for`` gives
    that key: a producer with another partitioner (librdkafka's default, CRC32) or a
    hand-picked partition would otherwise put one aggregate's history in two partitions,
    each with its own state and owner. ``num_partitions`` None: only the record key is
    checked (a partition that forwards whatever it receives, docs/design.md §18)."""
    encoded = key.encode()
    if record_key != encoded:
        shown = record_key.decode("utf-8", "replace")[:200] if record_key is not None else None
        return (f"the record key must be the envelope's tenant/schedule_id {key!r}, "
                f"got {shown!r}")
    if num_partitions is None:
        return None
    right = partition_for(encoded, num_partitions)
    if right != partition:
        return (f"key {key!r} belongs to partition {right} (Kafka's default murmur2 "
                f"partitioner over {num_partitions} partitions), not partition {partition}")
    return None


def range_assign(members: list[str], partitions: int) -> dict[str, range]:
    """Kafka's RangeAssignor for one topic: contiguous ranges over ``members`` in the order
    given (sorted ids), the first ones one larger. The embedded and in-memory logs assign
    so, so partition p of co-partitioned topics goes to the same member, as on Kafka."""
    per, extra = divmod(partitions, len(members))
    out: dict[str, range] = {}
    start = 0
    for i, member in enumerate(members):
        size = per + (1 if i < extra else 0)
        out[member] = range(start, start + size)
        start += size
    return out
