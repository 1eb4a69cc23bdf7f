"""The dev node audits itself: ``chronolog audit`` every ``every_s``, as a child process.

The log's pruning (``chronolog.processors.pruning``) removes no event the audit's latest
checkpoint still reads, and without an archive nothing at all before a first checkpoint: a
deployment runs ``chronolog audit`` on a timer, and the node does so for itself. A child
process, so that folding the new events never holds the node's event loop (the API, the
processor); each audit goes on from the last checkpoint, so it costs what is new. Its verdict
is logged (``node_audit``), and a failing one is said on stderr: a broken guarantee is not
something to find out weeks later.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from chronolog.wakeup import wait_within

log = structlog.get_logger("chronolog.devnode")

AUDIT_EVERY_S = 60.0


@dataclass
class NodeAudits:
    """Runs the node's audits until ``stop()`` (a part of the node's supervisor)."""

    data_dir: Path
    every_s: float = AUDIT_EVERY_S
    archive: str | None = None
    runs: int = 0
    last: str = ""  # the last audit's summary line
    failed: int = 0  # audits that found violations
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _child: asyncio.subprocess.Process | None = None

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "chronolog.cli.main", "audit",
                "--data-dir", str(self.data_dir)]
        if self.archive:
            argv += ["--archive", self.archive]
        return argv

    async def run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_within(self._stopping.wait(), self.every_s)
            if self._stopping.is_set():
                return
            await self.audit_once()

    async def audit_once(self) -> int:
        """One audit; its exit status (0 clean, 1 violations, 2 it could not run)."""
        child = self._child = await asyncio.create_subprocess_exec(
            *self.command(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await child.communicate()
        finally:
            if child.returncode is None:  # cancelled: the child stops with the node
                child.kill()
                await child.wait()
            self._child = None
        rc = child.returncode or 0
        lines = out.decode(errors="replace").strip().splitlines()
        self.runs += 1
        self.last = lines[-1] if lines else err.decode(errors="replace").strip()[-300:]
        if rc == 0:
            log.info("node_audit", rc=rc, summary=self.last)
        else:
            self.failed += rc == 1
            log.warning("node_audit", rc=rc, summary=self.last)
            print(f"chronolog dev: audit exited {rc}: {self.last}", file=sys.stderr,
                  flush=True)
        return rc

    def stop(self) -> None:
        self._stopping.set()
        child = self._child
        if child is not None and child.returncode is None:
            child.kill()
