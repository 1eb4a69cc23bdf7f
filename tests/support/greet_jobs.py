"""A job module of its own (``register(worker)``), as a user attaches with ``--jobs``:
``greet`` answers ``{"greeting": "hello <name>", "worker": <worker ID>}``."""

from __future__ import annotations

from typing import Any


def greet(ctx: Any) -> dict[str, Any]:
    return {"greeting": f"hello {ctx.params.get('name', 'you')}", "worker": ctx.worker_id}


def register(worker: Any) -> None:
    worker.register("greet", greet)
