"""chronolog job module of the burst benchmark, loaded by ``chronolog worker --jobs burst_jobs``
with ``bench/`` on PYTHONPATH.

``bench`` records its start (the burst); ``late`` records its start lateness, the time from
the occurrence's instant to the handler's start (the sustained load).
"""

import time

from burstlib import record, record_lateness


async def bench(ctx):  # type: ignore[no-untyped-def]
    record(int(ctx.params["jid"]), time.time())


async def late(ctx):  # type: ignore[no-untyped-def]
    now = time.time()
    instant = ctx.scheduled_at.timestamp()
    # the n-th occurrence of an every-1s schedule started at a whole second
    record_lateness(int(ctx.params["jid"]), round(instant) % 1_000_000, now - instant)


JOB_TYPES = ("bench", "late")  # the workers' consumer group is named after these


def register(worker):  # type: ignore[no-untyped-def]
    worker.register("bench", bench)
    worker.register("late", late)
