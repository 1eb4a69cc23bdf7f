"""Benchmark: the archive's segment codec on real chronolog events (docs/design.md §19).

A real processor decides ``--schedules`` CreateSchedule commands and then a claim, heartbeat,
complete and trigger per schedule on an embedded SQLite log (``bench/processor.py``'s
helpers); the resulting ``events`` records are cut into segments of ``--segment`` records per
partition, as the archive would write them (``chronolog.archive.format.segment_body``), and
each codec compresses and decompresses every segment. Printed per codec: the compressed size
as a fraction of the JSON lines, and compression and decompression speed in MB/s of JSON
lines (best of ``--repeat``). ``zstd-*`` rows appear when the ``zstandard`` package is
installed (it is not a dependency).

    .venv/bin/python bench/archive_codecs.py [--schedules 2000] [--segment 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import bz2
import gzip
import lzma
import time
from collections.abc import Callable
from typing import Any

from chronolog.archive.format import segment_body
from chronolog.domain import codec
from chronolog.log.reading import read_partition
from chronolog.processors.config import ProcessorConfig
from processor import (  # bench/processor.py: a real processor on a temporary SQLite log
    append_all,
    close_log,
    create_commands,
    drain,
    make_log,
    mixed_commands,
    records_of,
)

Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]


def codecs() -> dict[str, Codec]:
    out: dict[str, Codec] = {
        "gzip-1": (lambda b: gzip.compress(b, 1, mtime=0), gzip.decompress),
        "gzip-6": (lambda b: gzip.compress(b, 6, mtime=0), gzip.decompress),
        "gzip-9": (lambda b: gzip.compress(b, 9, mtime=0), gzip.decompress),
        "bz2-9": (lambda b: bz2.compress(b, 9), bz2.decompress),
        "lzma-6": (lambda b: lzma.compress(b, preset=6), lzma.decompress),
    }
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return out
    for level in (3, 9, 19):
        out[f"zstd-{level}"] = (zstandard.ZstdCompressor(level=level).compress,
                                zstandard.ZstdDecompressor().decompress)
    return out


async def segments(schedules: int, size: int) -> list[bytes]:
    lg = make_log("sqlite", 4, "NORMAL")
    await lg.start()
    await lg.ensure_topics()
    try:
        config = ProcessorConfig()
        await append_all(lg, records_of(lg, create_commands(schedules)))
        await drain(lg, schedules, config)
        runs = {}  # schedule -> its first run, from the events
        for records in (await events(lg)).values():
            for r in records:
                env = codec.decode_event(r.value)
                if env.type == "OccurrenceMaterialized":
                    runs.setdefault(env.schedule_id, env.payload.run_id)  # type: ignore[union-attr]
        cmds = mixed_commands(runs, 4 * len(runs))
        await drain(lg, len(cmds), config, records_of(lg, cmds), backlog=True)
        out = []
        for p, records in (await events(lg)).items():
            for i in range(0, len(records), size):
                part = records[i:i + size]
                out.append(segment_body(lg.topics.events, p, part[0].offset,
                                        part[-1].offset + 1, part))
        return out
    finally:
        await close_log(lg)


async def events(lg: Any) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for p in range(lg.topics.partitions):
        out[p] = [r async for batch in read_partition(lg, lg.topics.events, p) for r in batch]
    return out


def measure(bodies: list[bytes], codec: Codec, repeat: int) -> tuple[float, float, float]:
    compress, decompress = codec
    raw = sum(map(len, bodies))
    packed = [compress(b) for b in bodies]
    best_c = best_d = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for b in bodies:
            compress(b)
        best_c = min(best_c, time.perf_counter() - t)
        t = time.perf_counter()
        for b in packed:
            decompress(b)
        best_d = min(best_d, time.perf_counter() - t)
    return sum(map(len, packed)) / raw, raw / best_c / 1e6, raw / best_d / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=2000)
    ap.add_argument("--segment", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    bodies = asyncio.run(segments(args.schedules, args.segment))
    raw = sum(map(len, bodies))
    print(f"{len(bodies)} segments, {raw / 1e6:.2f} MB of JSON lines "
          f"({raw / len(bodies) / args.segment:.0f} B a record)")
    print(f"{'codec':8} {'size':>6} {'compress MB/s':>14} {'decompress MB/s':>16}")
    for name, pair in codecs().items():
        ratio, c, d = measure(bodies, pair, args.repeat)
        print(f"{name:8} {ratio:6.3f} {c:14.1f} {d:16.1f}")


if __name__ == "__main__":
    main()
