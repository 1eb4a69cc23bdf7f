"""The parallel phase's order: long tests at the front of the workers' shares."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from support.ordering import long_first, share_sizes


def test_the_shares_are_those_worksteal_hands_out() -> None:
    assert share_sizes(10, 4) == [2, 2, 3, 3]
    assert sum(share_sizes(1870, 4)) == 1870


def test_each_share_starts_with_its_long_tests_longest_first_to_the_least_loaded() -> None:
    weights = {"chaos": 240, "cli": 120, "http": 90, "lists": 70, "acl": 60}
    items = [f"t{i}" for i in range(20)] + list(weights)
    order = long_first(items, 4, weights.get)
    starts = [sum(share_sizes(len(items), 4)[:w]) for w in range(4)]
    assert [order[s] for s in starts] == ["chaos", "cli", "http", "lists"]
    assert order[starts[3] + 1] == "acl"  # the share with the fewest seconds (70)
    assert [i for i in order if i.startswith("t")] == [f"t{i}" for i in range(20)]


@given(st.lists(st.one_of(st.none(), st.integers(1, 300)), max_size=60), st.integers(1, 6))
def test_every_item_stays_once(weights: list[int | None], workers: int) -> None:
    items = list(range(len(weights)))
    order = long_first(items, workers, lambda i: weights[i])
    assert sorted(order) == items
