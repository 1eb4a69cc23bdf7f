"""A pruner process for kill -9 tests: archives and deletes every event of the given
partitions (their snapshot, projector and window needs all at the end), then exits.

    python tests/integration/prune_once.py LOG_URL PREFIX PARTITIONS ARCHIVE P,P,...

Prints ``pruning`` once it starts, so a test knows when to kill it.
"""

from __future__ import annotations

import asyncio
import sys

from chronolog.processors.pruning import Pruner
from chronolog.settings import open_log, parse_log_url


async def main(url: str, prefix: str, partitions: int, archive: str, which: str) -> None:
    lg = open_log(parse_log_url(url, partitions=partitions, prefix=prefix))
    await lg.start()
    try:
        pruner = Pruner(lg, retention_s=0, archive=archive)
        print("pruning", flush=True)
        for p in (int(x) for x in which.split(",")):
            await pruner.prune_events(p, await lg.end_offset(lg.topics.events, p))
    finally:
        await lg.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3], int(sys.argv[3]), *sys.argv[4:6]))
