"""The routing rule of a partition-count change (chronolog.domain.routing), model-checked.

The model: every partition is a FIFO queue of commands (the partition of ``commands``) and an
owner that decides them one at a time with ``place``. Clients send a key's commands to its
home in either version (a client on the old table, or any Kafka producer on the new count);
the change sends each partition a handover order at some moment; a handover moves every
key whose new home is elsewhere (an adopt command to that partition) and then appends its
handover-done to every partition of the new version — all in one step, as in one transaction.
Whatever the interleaving: a key is never held by two partitions, every command is decided
exactly once by the partition holding the key (or creating it), a command is forwarded at
most twice, and once every partition handed over each key is at its new home.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronolog.domain.routing import (
    HERE,
    Forward,
    PartitionRouting,
    RoutingChange,
    RoutingTable,
    RoutingVersion,
    follow,
    place,
)


@dataclass
class Command:
    key: int
    number: int
    hops: int = 0


class Model:
    def __init__(self, old: int, new: int, keys: list[int], existing: list[bool]) -> None:
        self.table = RoutingTable.initial(old).begin(new)
        self.to = self.table.get(2)
        n = self.table.partitions
        self.queues: list[deque[tuple[str, object]]] = [deque() for _ in range(n)]
        self.routing = [PartitionRouting.initial(p, self.table) for p in range(n)]
        self.held: list[set[int]] = [set() for _ in range(n)]
        for k, exists in zip(keys, existing, strict=True):
            if exists:
                self.held[k % old].add(k)
        self.decided: dict[int, int] = {}  # command number -> partition
        self.max_hops = 0
        self.handed: set[int] = set()

    def holders(self, key: int) -> list[int]:
        return [p for p, keys in enumerate(self.held) if key in keys]

    def send(self, cmd: Command, version: int) -> None:
        self.queues[self.table.get(version).home(cmd.key)].append(("cmd", cmd))

    def order_handover(self, p: int) -> None:
        if p < self.table.get(1).partitions and p not in self.handed:
            self.handed.add(p)
            self.queues[p].append(("handover", None))

    def step(self, p: int) -> bool:
        if not self.queues[p]:
            return False
        kind, item = self.queues[p].popleft()
        here = self.routing[p]
        if kind == "cmd":
            assert isinstance(item, Command)
            after = self.to if here.serves.version < self.to.version else None
            where = place(item.key, item.key in self.held[p], here, after)
            if where is HERE:
                assert item.number not in self.decided, "a command decided twice"
                self.decided[item.number] = p
                self.held[p].add(item.key)  # a create, or a command for the key held here
                assert self.holders(item.key) == [p], (item.key, self.holders(item.key))
            else:
                assert isinstance(where, Forward) and where.partition != p
                item.hops += 1
                self.max_hops = max(self.max_hops, item.hops)
                self.queues[where.partition].append(("cmd", item))
        elif kind == "adopt":
            assert isinstance(item, int)
            assert not self.holders(item), f"key {item} adopted while held elsewhere"
            self.held[p].add(item)
        elif kind == "done":
            version, sender = item  # type: ignore[misc]
            self.routing[p] = here.handover_received(version, sender)
        else:  # handover: one transaction
            moving = {k for k in self.held[p] if self.to.home(k) != p}
            self.held[p] -= moving
            for k in sorted(moving):
                self.queues[self.to.home(k)].append(("adopt", k))
            for q in range(self.to.partitions):
                if q != p:
                    self.queues[q].append(("done", (self.to.version, p)))
            self.routing[p] = here.handed_over(self.to)
        return True


counts = st.integers(min_value=1, max_value=9)


@pytest.mark.exhaustive
@settings(max_examples=300, deadline=None)
@given(old=counts, new=counts, data=st.data())
def test_a_partition_count_change_never_doubles_or_loses_a_command_in_any_interleaving(
    old: int, new: int, data: st.DataObject,
) -> None:
    new = old + new  # the count only grows (RoutingTable.begin)
    keys = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=12, unique=True))
    existing = data.draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)))
    model = Model(old, new, keys, existing)
    n = model.table.partitions
    actions = data.draw(st.lists(st.one_of(
        st.tuples(st.just("send"), st.sampled_from(keys), st.sampled_from([1, 2])),
        st.tuples(st.just("handover"), st.integers(0, n - 1), st.just(0)),
        st.tuples(st.just("step"), st.integers(0, n - 1), st.just(0)),
    ), max_size=120))
    sent = 0
    for kind, a, b in actions:
        if kind == "send":
            model.send(Command(a, sent), b)
            sent += 1
        elif kind == "handover":
            model.order_handover(a)
        else:
            model.step(a)
    for p in range(old):  # the change completes: every old partition hands over
        model.order_handover(p)
    for _ in range(100_000):  # drain every queue, round robin
        stepped = [model.step(p) for p in range(n)]  # every partition a step (no short cut)
        if not any(stepped):
            break
    assert not any(model.queues)
    assert sorted(model.decided) == list(range(sent)), "a command was lost"
    assert model.max_hops <= 2
    for k in keys:
        holders = model.holders(k)
        assert holders in ([], [model.to.home(k)]), (k, holders)
    # after the change, a command sent by the new table is decided at once, without a hop
    for k in keys:
        model.send(Command(k, sent), 2)
        while model.step(model.to.home(k)):
            pass
        assert model.decided[sent] == model.to.home(k)
        sent += 1


def test_a_key_that_never_moved_is_decided_at_home_in_either_version() -> None:
    table = RoutingTable.initial(4).begin(8)
    key = 5  # home 1 of 4 and 5 of 8
    old_home = PartitionRouting.initial(1, table)
    assert place(key, False, old_home) is HERE
    new_home = PartitionRouting.initial(5, table)
    assert place(key, False, new_home) == Forward(1)  # the old home has not handed over
    assert place(key, False, new_home.handover_received(2, 1)) is HERE
    assert place(key, False, old_home.handed_over(table.get(2))) == Forward(5)


def test_a_handover_done_read_before_the_partitions_own_handover_is_kept() -> None:
    table = RoutingTable.initial(2).begin(3)  # partition 1 receives from 0 (and sends)
    p1 = PartitionRouting.initial(1, table).handover_received(2, 0)
    after = p1.handed_over(table.get(2))
    assert after.has_received(0) and after.has_received(1) and not after.has_received(2)
    assert place(4, False, after) is HERE  # home 0 of 2, 1 of 3: 0's handover was read
    assert place(3, False, after) == Forward(0)  # home 1 of 2, 0 of 3: moved away from here
    assert place(7, False, after) is HERE  # home 1 of 2 and of 3: never moved
    # without the early handover-done, a key that would come from 0 may still be there
    late = PartitionRouting.initial(1, table).handed_over(table.get(2))
    assert place(4, False, late) == Forward(0)


def test_a_new_home_yet_to_hand_over_decides_a_new_key_whose_old_home_handed_over() -> None:
    # 4 -> 6 partitions; key 763: home 3 of 4, 1 of 6. Partition 3 handed over first, so it
    # forwards the key's commands to 1; partition 1 still serves version 1, where the key's
    # home is 3 — sent back there, the command would come back to 1 a third time.
    table = RoutingTable.initial(4).begin(6)
    key, v2 = 763, table.get(2)
    p1 = PartitionRouting.initial(1, table)
    assert place(key, False, p1, v2) == Forward(3)  # 3's handover-done not read: it may hold it
    read = p1.handover_received(2, 3)
    assert place(key, False, read, v2) is HERE  # anything 3 moved of it came before its done
    assert place(key, False, read) == Forward(3)  # without knowing version 2: as before
    assert place(key, True, read, v2) is HERE
    p0 = PartitionRouting.initial(0, table).handover_received(2, 3)
    assert place(key, False, p0, v2) == Forward(3)  # home 1 of 6 is not partition 0


def test_the_routing_table_allows_one_change_at_a_time() -> None:
    table = RoutingTable.initial(12)
    with pytest.raises(ValueError, match="already"):
        table.begin(12)
    moving = table.begin(24)
    assert moving.migrating == RoutingVersion(2, 24) and moving.current.partitions == 12
    with pytest.raises(ValueError, match="under way"):
        moving.begin(36)
    done = moving.complete()
    assert done.current == RoutingVersion(2, 24) and done.migrating is None
    assert done.partitions == 24 and done.begin(36).partitions == 36
    with pytest.raises(ValueError, match="only grow"):
        done.begin(6)
    with pytest.raises(ValueError, match="no change"):
        done.complete()
    with pytest.raises(ValueError, match="in order"):
        RoutingTable((RoutingVersion(2, 3),), 2)


# --------------------------------------------------------------------------- the history


def fold(changes: list[RoutingChange]) -> RoutingTable | None:
    table: RoutingTable | None = None
    for c in changes:
        table = follow(table, c)
    return table


def test_the_history_starts_with_version_one_complete() -> None:
    assert fold([RoutingChange(1, 12, True)]) == RoutingTable.initial(12)
    assert fold([RoutingChange(2, 24, False)]) is None  # no start: no table
    assert fold([RoutingChange(1, 12, False)]) is None


def test_a_change_begins_then_completes_and_clients_route_by_it_only_then() -> None:
    begun = fold([RoutingChange(1, 12, True), RoutingChange(2, 24, False)])
    assert begun is not None and begun.current.partitions == 12
    assert begun.migrating == RoutingVersion(2, 24)
    done = follow(begun, RoutingChange(2, 24, True))
    assert done is not None and done.current == RoutingVersion(2, 24)
    assert done.migrating is None


def test_of_two_changes_begun_at_once_the_first_on_the_log_wins() -> None:
    table = fold([RoutingChange(1, 12, True), RoutingChange(2, 24, False),
                  RoutingChange(2, 16, False), RoutingChange(2, 16, True)])
    assert table is not None and table.migrating == RoutingVersion(2, 24)
    assert table.active == 1  # the loser's completion completes nothing


def test_a_repeated_or_out_of_order_change_changes_nothing() -> None:
    start = [RoutingChange(1, 12, True), RoutingChange(2, 24, False)]
    table = fold(start)
    assert fold([*start, RoutingChange(2, 24, False)]) == table
    assert fold([*start, RoutingChange(3, 48, False)]) == table  # one change at a time
    done = fold([*start, RoutingChange(2, 24, True)])
    assert fold([*start, RoutingChange(2, 24, True), RoutingChange(2, 24, True)]) == done
    assert fold([*start, RoutingChange(2, 24, True), RoutingChange(1, 12, True)]) == done


def test_the_partition_count_only_grows() -> None:
    table = fold([RoutingChange(1, 12, True), RoutingChange(2, 6, False)])
    assert table == RoutingTable.initial(12)
    assert fold([RoutingChange(1, 12, True), RoutingChange(2, 12, False)]) == table
