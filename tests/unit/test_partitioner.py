"""chronolog.log.partitioner must agree with Kafka's default partitioner bit for bit.

The reference is aiokafka's own pure-Python port of the Java client's murmur2 and its
``DefaultPartitioner``; a few fixed vectors come from the Java client's test suite.
"""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as ref_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from chronolog.log.partitioner import murmur2, partition_for


@settings(max_examples=2000, deadline=None)
@given(st.binary(min_size=0, max_size=200))
def test_murmur2_matches_aiokafka(data: bytes) -> None:
    assert murmur2(data) == ref_murmur2(data)


@settings(max_examples=2000, deadline=None)
@given(st.binary(min_size=0, max_size=64), st.integers(min_value=1, max_value=1000))
def test_partition_for_matches_default_partitioner(key: bytes, n: int) -> None:
    partitions = list(range(n))
    assert partition_for(key, n) == DefaultPartitioner()(key, partitions, partitions)


@given(st.text(max_size=40))
def test_partition_for_text_keys(key: str) -> None:
    raw = key.encode()
    assert partition_for(raw, 12) == (ref_murmur2(raw) & 0x7FFFFFFF) % 12


def test_known_java_vectors() -> None:
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed Java ints)
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF, data


def test_spreads_keys() -> None:
    counts = [0] * 12
    for i in range(12000):
        counts[partition_for(f"tenant/{i}".encode(), 12)] += 1
    assert min(counts) > 800
