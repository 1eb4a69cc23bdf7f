"""The order of the parallel phase: the long tests first, one worker each.

pytest-xdist's ``worksteal`` scheduler gives each of its ``n`` workers a contiguous share of
the collection (``len(pending) // workers_left`` tests each, in order), and an idle worker then
steals the second half of the longest queue. A test that takes minutes and sits near the end
of a share starts late and alone, and the suite waits for it: the tail of a run. So the tests
marked ``long(seconds)`` go to the front of the shares, the longest first to the share with
the fewest seconds so far (longest processing time first); the others keep their order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def share_sizes(total: int, workers: int) -> list[int]:
    """The sizes of the shares ``worksteal`` first hands out, in order."""
    sizes, left = [], total
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def long_first(items: Sequence[T], workers: int, seconds: Callable[[T], float | None]
               ) -> list[T]:
    """``items`` reordered so that each share starts with its long tests (``seconds`` of an
    item: its expected duration, ``None`` for the others); the same items, each once."""
    if workers < 2:
        return list(items)
    long = sorted((s, i) for i, s in ((i, seconds(it)) for i, it in enumerate(items))
                  if s is not None)
    heads: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for s, i in reversed(long):  # the longest first, to the least loaded share
        w = loads.index(min(loads))
        heads[w].append(i)
        loads[w] += s
    taken = {i for _, i in long}
    rest = iter([i for i in range(len(items)) if i not in taken])
    order: list[int] = []
    for head, size in zip(heads, share_sizes(len(items), workers), strict=True):
        order += head
        order += [i for _, i in zip(range(size - len(head)), rest, strict=False)]
    order += list(rest)
    return [items[i] for i in order]


def order_for_workers(items: list[Any]) -> None:
    """Reorder a worker's collection (``pytest_collection_modifyitems``) so that the tests
    marked ``long(seconds)`` start first, one worker each; every worker computes the same
    order, and only the workers' order counts (the controller hands out indices into it).
    A worker's own ``config.option.dist`` is always "no", so its worker count is what
    tells: nothing changes outside a parallel run."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if "PYTEST_XDIST_WORKER" not in os.environ or workers < 2:
        return
    items[:] = long_first(items, workers, _expected_seconds)


def _expected_seconds(item: Any) -> float | None:
    mark = item.get_closest_marker("long")
    return float(mark.args[0]) if mark is not None else None
