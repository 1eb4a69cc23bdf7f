"""Run the test suite in two phases: ``--jobs`` pytest processes for every test not marked
``serial``, then the ``serial`` tests in one process, alone on the machine.

``make test`` runs this inside scripts/with_services.py, so both phases share one broker and
one PostgreSQL server. Tests isolate themselves (a topic prefix, a database or schema, a
temporary directory and free ports of their own), so the parallel phase needs no more than
that. A test is marked ``serial`` when it loads the machine enough to starve its neighbours
(or be starved by them) or takes a server down and up. Arguments after ``--`` go to both
phases; the exit status is the first failing phase's (pytest's "no tests collected" in the
serial phase is not a failure).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

NO_TESTS_COLLECTED = 5


def phases(jobs: int, extra: list[str]) -> list[list[str]]:
    pytest = [sys.executable, "-m", "pytest"]
    spread = ["-n", str(jobs), "--dist", "worksteal"] if jobs > 1 else []
    return [[*pytest, *spread, "-m", "not serial", *extra], [*pytest, "-m", "serial", *extra]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="parallel pytest processes")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    status = 0
    for command in phases(args.jobs, args.pytest_args):
        print("$", " ".join(command[1:]), flush=True)
        code = subprocess.call(command)
        if code not in (0, NO_TESTS_COLLECTED) and status == 0:
            status = code
    return status


if __name__ == "__main__":
    sys.exit(main())
