"""chronolog job module of the burst benchmark: job type ``bench`` records its start.

Loaded by ``chronolog worker --jobs burst_jobs`` with ``bench/`` on PYTHONPATH.
"""

import time

from burstlib import record


async def bench(ctx):  # type: ignore[no-untyped-def]
    record(int(ctx.params["jid"]), time.time())


def register(worker):  # type: ignore[no-untyped-def]
    worker.register("bench", bench)
