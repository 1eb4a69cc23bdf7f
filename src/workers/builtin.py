"""Built-in jobs for demos and tests: ``noop``, ``echo``, ``sleep``, ``fail``.

* ``noop``: returns nothing (result ``null``);
* ``echo``: the result is the run's params;
* ``sleep``: ``{"seconds": x}`` — sleeps, cancellable (a lost lease or a cancel request wakes
  it with ``Cancelled``); returns ``{"slept": x}``;
* ``fail``: ``{"times": n, "kind": "transient|permanent|ambiguous"}`` — fails the first n
  attempts (by ``ctx.attempt``) with that error class, then returns ``{"attempt": k}``.
"""

from __future__ import annotations

from typing import Any

from chronolog.workers.job import Ambiguous, JobContext, JobRegistry, Permanent

BUILTIN_JOB_TYPES = ("noop", "echo", "sleep", "fail")


async def noop(ctx: JobContext) -> None:
    return None


async def echo(ctx: JobContext) -> dict[str, Any]:
    return ctx.params


async def sleep(ctx: JobContext) -> dict[str, Any]:
    seconds = float(ctx.params.get("seconds", 1.0))
    await ctx.sleep(seconds)
    return {"slept": seconds}


async def fail(ctx: JobContext) -> dict[str, Any]:
    times = int(ctx.params.get("times", 1))
    kind = str(ctx.params.get("kind", "transient"))
    if ctx.attempt <= times:
        message = f"built-in failure {ctx.attempt}/{times} ({kind})"
        if kind == "permanent":
            raise Permanent(message)
        if kind == "ambiguous":
            raise Ambiguous(message)
        if kind != "transient":
            raise Permanent(f"unknown failure kind {kind!r}")
        raise RuntimeError(message)
    return {"attempt": ctx.attempt}


def register_builtin_jobs(registry: JobRegistry) -> None:
    for name, fn in (("noop", noop), ("echo", echo), ("sleep", sleep), ("fail", fail)):
        registry.register(name, fn)
