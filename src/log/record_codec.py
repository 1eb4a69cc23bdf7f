"""How the embedded log stores a record's value and headers: compressed, with a dictionary.

Kafka producers compress batches of records (zstd by default); the embedded log stores one
row per record, and a record of chronolog is a few hundred bytes of JSON that zstd alone
barely shrinks. With a *dictionary* — typical records of every kind (events, commands,
replies, assignments and their headers), frozen in ``dictionaries/record_v1.zdict`` — zstd
keeps about 35 % of a record for ~3 us to compress and ~1 us to expand (measured on a dev
node's records), so the log's rows shrink to about a third at a few percent of a core.

A row's ``codec`` column says how it is stored: NULL (rows written before, and the compacted
topics' rows) as given; ``1`` — zstd with dictionary 1. The dictionary is part of the file
format: it never changes (a test holds its SHA-256); a better one would be codec ``2``, with
``1`` still read. Compressors and decompressors are per thread (the log's writer and reader
threads; zstd contexts are not thread-safe).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib import resources

import zstandard

CODEC_ZSTD_DICT_1 = 1
LEVEL = 3

_DICTIONARY = zstandard.ZstdCompressionDict(
    resources.files("chronolog.log.dictionaries").joinpath("record_v1.zdict").read_bytes(),
    dict_type=zstandard.DICT_TYPE_RAWCONTENT)
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c: zstandard.ZstdCompressor | None = getattr(_local, "c", None)
    if c is None:
        c = _local.c = zstandard.ZstdCompressor(
            level=LEVEL, dict_data=_DICTIONARY, write_checksum=False,
            write_content_size=True, write_dict_id=False)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor(dict_data=_DICTIONARY)
    return d


def pack(data: bytes) -> bytes:
    """``data`` as codec ``CODEC_ZSTD_DICT_1`` stores it."""
    return _compressor().compress(data)


def pack_many(datas: Sequence[bytes]) -> list[bytes]:
    """``pack`` of each of ``datas``, the same bytes, in one call into zstd.

    zstd releases the GIL for every call. The log's writer and reader threads run beside a
    busy event loop (a processor deciding a burst), and a thread that has released the GIL
    waits up to the interpreter's switch interval (5 ms) to take it back: one release per
    record made a transaction of 500 records take 1.6 s instead of 7 ms, while it held the
    database's write lock (docs/run-path.md). One call, one release."""
    c = _compressor()
    # an empty input has no frame to batch; the batch calls are the C backend's (the one
    # CPython's wheels use)
    if len(datas) < 2 or not all(datas) or not hasattr(c, "multi_compress_to_buffer"):
        return [pack(d) for d in datas]
    packed = c.multi_compress_to_buffer(list(datas))
    return [packed[i].tobytes() for i in range(len(datas))]


def unpack_many(rows: Sequence[tuple[int | None, bytes]]) -> list[bytes]:
    """``unpack`` of each ``(codec, stored)``, those of codec ``CODEC_ZSTD_DICT_1`` in one
    call into zstd (one release of the GIL: ``pack_many``)."""
    # frames of empty content are expanded one by one: zstd's batch call corrupts memory
    # when every frame it is given is empty (seen: "malloc(): unsorted double linked list
    # corrupted"), and a frame of nothing costs nothing to expand alone
    packed = [i for i, (codec, stored) in enumerate(rows)
              if codec == CODEC_ZSTD_DICT_1 and stored
              and zstandard.frame_content_size(stored) != 0]
    d = _decompressor()
    if len(packed) < 2 or not hasattr(d, "multi_decompress_to_buffer"):
        return [unpack(codec, stored) for codec, stored in rows]
    batched = set(packed)
    out = [b"" if i in batched else unpack(codec, stored)
           for i, (codec, stored) in enumerate(rows)]
    expanded = d.multi_decompress_to_buffer([rows[i][1] for i in packed])
    for n, i in enumerate(packed):
        out[i] = expanded[n].tobytes()
    return out


def unpack(codec: int | None, stored: bytes) -> bytes:
    """What a row stored with ``codec`` holds (``ValueError`` for an unknown codec)."""
    if codec is None:
        return stored
    if codec == CODEC_ZSTD_DICT_1:
        return _decompressor().decompress(stored)
    raise ValueError(f"a log record stored with unknown codec {codec} (a newer chronolog?)")
