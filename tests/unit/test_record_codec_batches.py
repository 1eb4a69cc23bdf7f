"""``pack_many`` and ``unpack_many``: the embedded log's batched zstd calls store and read
exactly the bytes the one-record calls do (a row written either way reads the same)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronolog.log.record_codec import CODEC_ZSTD_DICT_1, pack, pack_many, unpack, unpack_many

records = st.lists(st.binary(max_size=600), max_size=40)


@given(records)
def test_pack_many_is_pack_of_each(datas: list[bytes]) -> None:
    assert pack_many(datas) == [pack(d) for d in datas]


@given(st.lists(st.tuples(st.booleans(), st.binary(max_size=600)), max_size=40))
def test_unpack_many_reads_a_mix_of_stored_and_raw_rows_as_unpack_does(
        rows: list[tuple[bool, bytes]]) -> None:
    stored = [(CODEC_ZSTD_DICT_1, pack(data)) if packed else (None, data)
              for packed, data in rows]
    assert unpack_many(stored) == [unpack(codec, s) for codec, s in stored]
    assert unpack_many(stored) == [data for _, data in rows]
