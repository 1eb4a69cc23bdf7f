"""A log started for the length of a block, on any adapter."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any


@contextlib.asynccontextmanager
async def started(lg: Any) -> AsyncIterator[Any]:
    """``lg`` started with its topics ensured; closed afterwards."""
    await lg.start()
    await lg.ensure_topics()
    try:
        yield lg
    finally:
        await lg.close()
