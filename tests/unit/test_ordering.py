"""The parallel phase's order: long tests at the front of the workers' shares."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


TESTS = Path(__file__).resolve().parents[1]


def test_a_parallel_run_starts_its_long_test_first(tmp_path: Path) -> None:
    # given ten short tests and, last in the file, one marked long, each noting its start
    (tmp_path / "conftest.py").write_text(
        "from support.ordering import order_for_workers\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'long(seconds): first')\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    order_for_workers(items)\n")
    started = tmp_path / "started"
    body = "\n".join(f"def test_{i:02d}(): note('test_{i:02d}')" for i in range(10))
    (tmp_path / "test_some.py").write_text(
        "import os, pytest\n"
        f"def note(name):\n    open({str(started)!r}, 'a').write("
        "os.environ['PYTEST_XDIST_WORKER'] + ' ' + name + '\\n')\n"
        f"{body}\n@pytest.mark.long(60)\ndef test_long(): note('test_long')\n")
    # when they run in two worksteal workers
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "worksteal", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert done.returncode == 0, done.stdout + done.stderr
    # then the long one is the first test a worker starts
    lines = started.read_text().split()
    firsts: dict[str, str] = {}
    for worker, name in zip(lines[::2], lines[1::2], strict=True):
        firsts.setdefault(worker, name)
    assert "test_long" in firsts.values(), lines
