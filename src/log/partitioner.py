"""Kafka's default partitioner, in pure Python: ``murmur2`` and ``partition_for``.

Both log backends place a keyed record on ``(murmur2(key) & 0x7fffffff) % n`` — exactly what
the Java client's ``Utils.toPositive(Utils.murmur2(key)) % numPartitions`` (and aiokafka's
``DefaultPartitioner``) does — so a key lands on the same partition in SQLite and in Kafka.

``murmur2`` returns the hash as an *unsigned* 32-bit integer (like aiokafka's ``murmur2``);
Java's ``int`` result is the signed view of the same 32 bits, and ``& 0x7fffffff`` gives the
same value for both. Nothing is cached.
"""

from __future__ import annotations

import struct

__all__ = ["murmur2", "partition_for"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 (seed 0x9747b28c) of ``data``, as Kafka computes it; unsigned 32-bit."""
    length = len(data)
    m = _M
    h = (_SEED ^ length) & _MASK
    nblocks = length >> 2
    if nblocks:
        # little-endian 32-bit blocks, decoded in one C call
        for k in struct.unpack_from(f"<{nblocks}I", data):
            k = (k * m) & _MASK
            k ^= k >> 24
            k = (k * m) & _MASK
            h = ((h * m) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = length & ~3
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * m) & _MASK
    h ^= h >> 13
    h = (h * m) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``num_partitions``."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
