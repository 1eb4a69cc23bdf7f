"""The order of the parallel phase: the slowest tests first, each on a worker of its own.

``pytest -n N --dist worksteal`` (scripts/run_suite.py) hands worker ``i`` the ``i``-th of
``N`` consecutive slices of the collection; a worker runs its slice from the front, and an
idle worker takes the back half of the longest queue. A test of several minutes collected
late therefore starts late and ends the run alone. A test marked ``slow(seconds=...)`` (its
duration under the suite's load, roughly) is moved to the front of a slice instead: the
slowest first, each onto the slice whose slow tests add up to the least so far (longest
processing time first). A module marked so moves as one unit (its tests share a
module-scoped fixture; ``seconds`` is the whole module's). Every other test keeps its
collection order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def slices(n: int, workers: int) -> list[int]:
    """The sizes of the slices worksteal hands ``workers`` idle workers out of ``n`` tests
    (each takes an equal share of what is left)."""
    sizes, left = [], n
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def slowest_first(items: Sequence[T], units: Sequence[tuple[Sequence[int], float]],
                  workers: int) -> list[T]:
    """``items`` reordered so that the slow ``units`` (the indices of their items, and how
    long they take together) head the slices as above; unchanged where they would not fit
    at the heads."""
    if workers < 2 or not units:
        return list(items)
    sizes = slices(len(items), workers)
    heads: list[list[int]] = [[] for _ in sizes]
    loads = [0.0] * len(sizes)
    for indices, seconds in sorted(units, key=lambda u: (-u[1], min(u[0]))):
        w = min(range(len(sizes)), key=lambda k: (loads[k], k))
        heads[w] += indices
        loads[w] += seconds
    if any(len(h) > size for h, size in zip(heads, sizes, strict=True)):
        return list(items)
    moved = {i for indices, _ in units for i in indices}
    rest = iter(i for i in range(len(items)) if i not in moved)
    order: list[int] = []
    for head, size in zip(heads, sizes, strict=True):
        order += head
        order += [next(rest) for _ in range(size - len(head))]
    return [items[i] for i in order]
