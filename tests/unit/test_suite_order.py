"""The parallel phase's order (tests/support/ordering.py): slow tests head the slices that
worksteal hands out, the slowest first, spread by their durations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from support.ordering import slices, slowest_first


def heads(order: list[int], workers: int) -> list[int]:
    starts, at = [], 0
    for size in slices(len(order), workers):
        starts.append(order[at])
        at += size
    return starts


def test_slices_are_what_worksteal_hands_idle_workers() -> None:
    assert slices(10, 4) == [2, 2, 3, 3]
    assert slices(1597, 4) == [399, 399, 399, 400]
    assert sum(slices(7, 3)) == 7


def test_the_slowest_tests_each_head_a_slice_of_their_own() -> None:
    items = list(range(100))
    order = slowest_first(items, [([90], 400.0), ([50], 200.0), ([10], 100.0), ([70], 90.0)],
                          workers=4)
    assert heads(order, 4) == [90, 50, 10, 70]


def test_a_further_slow_test_goes_to_the_slice_with_the_least_slow_work() -> None:
    items = list(range(100))
    order = slowest_first(items, [([1], 400.0), ([2], 200.0), ([3], 150.0), ([4], 40.0)],
                          workers=3)
    sizes = slices(100, 3)
    third = order[sizes[0] + sizes[1]:]
    assert third[:2] == [3, 4]  # 150 + 40 < 200 < 400


def test_a_module_unit_stays_together_in_collection_order() -> None:
    items = list(range(40))
    order = slowest_first(items, [([30, 31, 32], 300.0), ([5], 100.0)], workers=2)
    assert order[:3] == [30, 31, 32]
    assert order[slices(40, 2)[0]] == 5


def test_without_workers_or_slow_tests_the_order_is_kept() -> None:
    items = list(range(12))
    assert slowest_first(items, [([3], 10.0)], workers=1) == items
    assert slowest_first(items, [], workers=4) == items
    assert slowest_first(items, [([0, 1, 2, 3], 10.0)], workers=4) == items  # too many


@settings(deadline=None)
@given(n=st.integers(1, 300), workers=st.integers(2, 8), data=st.data())
def test_the_order_is_a_permutation_that_keeps_the_others_in_collection_order(
    n: int, workers: int, data: st.DataObject,
) -> None:
    slow = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=min(n, 10)))
    units = [([i], float(data.draw(st.integers(1, 500)))) for i in slow]
    order = slowest_first(list(range(n)), units, workers)
    assert sorted(order) == list(range(n))
    others = [i for i in order if i not in slow]
    assert others == sorted(others)
