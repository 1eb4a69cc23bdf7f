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


def test_unpack_many_of_frames_of_empty_content_reads_them_empty() -> None:
    # zstd's batch call is not given frames of empty content (it corrupts memory when
    # every frame is empty): they read as b"" beside the others
    rows = [(CODEC_ZSTD_DICT_1, pack(b"")), (CODEC_ZSTD_DICT_1, pack(b""))]
    assert unpack_many(rows) == [b"", b""]
    mixed = [*rows, (CODEC_ZSTD_DICT_1, pack(b"ab")), (CODEC_ZSTD_DICT_1, pack(b"cd"))]
    assert unpack_many(mixed) == [b"", b"", b"ab", b"cd"]
