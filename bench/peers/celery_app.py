"""Celery app of the burst benchmark: task ``noop`` records its start (no result backend)."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from celery import Celery

from burstlib import record

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6399/0"))
app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False, enable_utc=True,
                broker_connection_retry_on_startup=True, worker_send_task_events=False)


@app.task(name="noop")
def noop(jid: int) -> None:
    record(jid, time.time())
