"""A processor process that writes snapshots in small chunks, often (for kill -9 tests).

    python tests/integration/snapshot_processor.py LOG_URL PREFIX PARTITIONS MEMBER

Prints ``assigned N`` whenever its owned partitions change, so a test knows it runs.
"""

from __future__ import annotations

import asyncio
import sys

from chronolog.processors.config import ProcessorConfig
from chronolog.processors.runtime import Processor
from chronolog.settings import open_log, parse_log_url


async def main(url: str, prefix: str, partitions: int, member: str) -> None:
    lg = open_log(parse_log_url(url, partitions=partitions, prefix=prefix))
    await lg.start()
    await lg.ensure_topics()
    proc = Processor(lg, member, config=ProcessorConfig(
        snapshot_interval_s=0.05, snapshot_chunk=2, batch_max=50))
    task = asyncio.create_task(proc.run())
    seen = -1
    while not task.done():
        if len(proc.partitions) != seen:
            seen = len(proc.partitions)
            print("assigned", seen, flush=True)
        await asyncio.sleep(0.05)
    await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
