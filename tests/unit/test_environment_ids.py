"""``new_id``: fresh random identifiers drawn from the OS in blocks, never repeated — not
within a process, not across its threads, not between a parent and a forked child."""

from __future__ import annotations

import os
import re
import threading

from chronolog.environment import new_id


def test_an_id_is_32_hex_digits_and_none_repeats_across_many_draws() -> None:
    ids = [new_id() for _ in range(50_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_threads_draw_distinct_ids() -> None:
    drawn: list[list[str]] = [[] for _ in range(4)]

    def draw(into: list[str]) -> None:
        into.extend(new_id() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(d,)) for d in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for d in drawn for i in d]
    assert len(set(every)) == len(every) == 20_000


def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    new_id()  # the parent holds a drawn block with IDs left in it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next IDs, then out without running the parent's cleanup
        os.write(write, "".join(new_id() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        child = f.read().decode()
    parent = "".join(new_id() for _ in range(8))
    child_ids = {child[i:i + 32] for i in range(0, len(child), 32)}
    parent_ids = {parent[i:i + 32] for i in range(0, len(parent), 32)}
    assert len(child_ids) == 8
    assert not child_ids & parent_ids
