"""A dev node (``run_node``: processor, projector, its own worker, effect runner, API) and a
worker attached to it, on both logs: the node refuses a job type it does not know (400
naming the known ones), accepts one an attached worker serves, and its live view shows a run
that waits for a worker — with the reason — until a worker serving its job type starts."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from chronolog.devnode.view import gather, render
from chronolog.projections.store import PostgresProjectionStore
from chronolog.workers import Worker
from support import greet_jobs
from support.polling import wait_until
from support.workers import serving

from .test_poison_node import STEADY, Node, store  # noqa: F401 - store: a fixture

pytestmark = pytest.mark.postgres

WAITING = "no worker serves job type 'greet' in class 'default'"


async def view(node: Node) -> str:
    out = io.StringIO()
    frame = render(await gather(node.node))
    assert frame.errors == ()
    Console(file=out, width=200, color_system=None).print(frame.renderable)
    return out.getvalue()


async def test_the_dev_node_knows_its_job_types_and_its_live_view_says_why_a_run_waits(
    event_log: Any, store: PostgresProjectionStore, tmp_path: Path  # noqa: F811
) -> None:
    async with Node(event_log, store, tmp_path) as node:
        r = await node.create(STEADY, "typo", {"every": "5s", "job": {"type": "ecoh"}})
        assert r.status_code == 400 and r.json()["field"] == "job.type"
        assert "known job types: echo, fail, noop, sleep" in r.json()["message"]

        # a client that bypasses the API is not refused: its run waits, and says why
        now = datetime.now(UTC).isoformat()
        await node.node.parts["client"].create_schedule(
            "steady", "greeter", {"at": now, "job": {"type": "greet"}})

        async def waiting() -> Any:
            text = await view(node)
            return text if WAITING in text else None

        text = await wait_until(waiting, 30, what="the live view's waiting run")
        # one tenant on screen: its schedules are named without it
        assert "greeter" in text.split("waiting to start", 1)[1]

        async with serving(event_log, tmp_path, "w-greet", greet_jobs.register) as greet:
            async def served() -> Any:
                text = await view(node)
                return text if WAITING not in text and greet.stats.completed else None

            text = await wait_until(served, 30, what="the run served and the view clear")
            assert "waiting to start" not in text
            # the attached worker's job type is known once its announcement is projected (a
            # refused create writes nothing, so it may be sent again)
            async def accepted() -> Any:
                r = await node.create(STEADY, "greeter-2",
                                      {"every": "5s", "job": {"type": "greet"}})
                assert r.status_code in (201, 400), r.text
                return r if r.status_code == 201 else None

            r = await wait_until(accepted, 30, what="greet accepted by the dev node")
            assert "warnings" not in r.json()


async def test_a_dev_node_without_its_builtin_worker_serves_only_what_attached_workers_serve(
    event_log: Any, store: PostgresProjectionStore, tmp_path: Path  # noqa: F811
) -> None:
    async with Node(event_log, store, tmp_path, builtin=False) as node:  # dev --no-builtin
        assert "worker" not in node.node.parts
        r = await node.create(STEADY, "early", {"every": "1s", "job": {"type": "echo"}})
        assert r.status_code == 400 and "known job types: none" in r.json()["message"]
        async with serving(event_log, tmp_path, "mine", Worker.builtin_jobs) as mine:
            async def accepted() -> Any:
                r = await node.create(STEADY, "echoes", {"every": "1s", "job": {"type": "echo"}})
                assert r.status_code in (201, 400), r.text
                return r if r.status_code == 201 else None

            await wait_until(accepted, 30, what="echo accepted once a worker serves it")
            await wait_until(lambda: node.succeeded("echoes"), 30, what="an echo run served")
            assert mine.stats.invocations >= 1  # the run ran in the attached worker
