"""The burst protocol on Celery 5 + Redis, run by ``bench/burst.py --compare celery``.

    bench/.peers/venv/bin/python bench/peers/celery_burst.py --n N --run-dir DIR [--lead S]

Redis (Debian's ``redis-server``) is started here on 127.0.0.1:6399 with persistence off and
stopped by PID; 2 ``celery worker --pool prefork -c 8`` processes; one client process sends
``noop.apply_async(args=[i], eta=T)`` one call per job. Prints one JSON object: the analysis
of ``burstlib``, the enqueue rate and CPU seconds per process group.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import burstlib as B  # noqa: E402

PORT = 6399


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--pool", default="prefork")
    ap.add_argument("--est-rate", type=float, default=800.0, help="enqueue rate guess to place T")
    ap.add_argument("--margin", type=float, default=10.0, help="seconds between enqueue and T")
    a = ap.parse_args()
    run = a.run_dir
    os.makedirs(run, exist_ok=True)
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("redis-server not found: apt-get install redis-server (Debian)")
    redis_proc = subprocess.Popen([server, "--port", str(PORT), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL)
    env = dict(os.environ, BENCH_RUN_DIR=run, BENCH_REDIS_URL=f"redis://127.0.0.1:{PORT}/0",
               PYTHONPATH=HERE + os.pathsep + os.path.dirname(HERE))
    os.environ.update(BENCH_RUN_DIR=run, BENCH_REDIS_URL=env["BENCH_REDIS_URL"])
    workers: list[subprocess.Popen[bytes]] = []
    try:
        import redis

        r = redis.Redis(host="127.0.0.1", port=PORT)
        deadline = time.time() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        r.flushall()
        celery = os.path.join(os.path.dirname(sys.executable), "celery")
        for i in range(a.workers):
            workers.append(subprocess.Popen(
                [celery, "-A", "celery_app", "worker", "-n", f"w{i}@bench", "--pool", a.pool,
                 "-c", str(a.concurrency), "--loglevel", "WARNING", "--without-gossip",
                 "--without-mingle", "--without-heartbeat"],
                env=env, cwd=HERE, stdout=open(f"{run}/worker{i}.log", "wb"),
                stderr=subprocess.STDOUT))
        # ready: every worker answers a ping (bounded)
        from celery_app import app, noop

        deadline = time.time() + 60
        while len(app.control.ping(timeout=0.5) or []) < a.workers:
            if time.time() > deadline:
                raise SystemExit("celery workers did not answer a ping within 60 s")
        time.sleep(2)
        wpids = [w.pid for w in workers]
        rpids = [redis_proc.pid]
        cpu0 = (B.cpu_seconds(wpids), B.cpu_seconds(rpids), time.process_time())
        t0 = time.time()
        instant = float(int(t0 + a.n / a.est_rate * 1.2 + a.margin) + 1)
        eta = dt.datetime.fromtimestamp(instant, tz=dt.UTC)
        for i in range(a.n):
            noop.apply_async(args=[i], eta=eta)
        t1 = time.time()
        cpu1 = (B.cpu_seconds(wpids), B.cpu_seconds(rpids), time.process_time())
        B.wait_until(instant - 2)
        cpu2 = (B.cpu_seconds(wpids), B.cpu_seconds(rpids))
        B.wait_records(run, a.n, instant + 600)
        cpu3 = (B.cpu_seconds(wpids), B.cpu_seconds(rpids))
        res = B.analyse(run, a.n, instant)
        res.update(
            system="celery", enqueue_rate=a.n / (t1 - t0), gap_after_enqueue=instant - t1,
            cpu_enqueue={"workers": cpu1[0] - cpu0[0], "redis": cpu1[1] - cpu0[1],
                         "client": cpu1[2] - cpu0[2]},
            cpu_burst={"workers": cpu3[0] - cpu2[0], "redis": cpu3[1] - cpu2[1]},
        )
        print(json.dumps(res))
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        redis_proc.terminate()
        redis_proc.wait(10)


if __name__ == "__main__":
    main()
