"""The benchmark and chaos commands the docs give name scripts that exist and only options
those scripts have (README.md "Performance", docs/performance.md, docs/deployment.md "Chaos").

The full-size runs take minutes to hours and load the machine: their figures come from
running them by hand. Each command line is taken apart as the shell would — environment
assignments, ``scripts/with_services.py FLAGS -- CMD``, ``make chaos ARGS="..."`` — and each
script's options are checked against its own ``--help``. The README's burst command and the
SQLite commands of bench/audit.py and bench/failover.py also run, their sizes made small
(tests/integration/test_doc_blocks.py).
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support.docs import all_doc_blocks

from .test_doc_blocks import _BENCH, NAMED

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _usage(script: str) -> str:
    r = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    return r.stdout + r.stderr


def _invocations(words: list[str]) -> list[tuple[str, list[str]]]:
    """``(script, args)`` of one command line: the wrapper's and the wrapped command's."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value before the command
    if words[:2] == ["make", "chaos"]:
        args = [w.split("=", 1)[1] for w in words[2:] if w.startswith("ARGS=")]
        return [("scripts/chaos.py", shlex.split(args[0]) if args else [])]
    assert words and words[0] == ".venv/bin/python", words
    script, rest = words[1], words[2:]
    if "--" in rest:
        cut = rest.index("--")
        return [(script, rest[:cut]), *_invocations(rest[cut + 1:])]
    return [(script, rest)]


def _documented_commands() -> list[list[str]]:
    blocks = [b for b in all_doc_blocks(ROOT) if NAMED.get(b.key) == _BENCH]
    assert len(blocks) == sum(1 for v in NAMED.values() if v == _BENCH)
    return [shlex.split(line, comments=True) for b in blocks for line in b.text.splitlines()
            if line.strip() and not line.startswith("#")]


def test_every_documented_benchmark_command_names_options_its_script_has() -> None:
    commands = _documented_commands()
    assert len(commands) >= 25
    scripts = {script for words in commands for script, _ in _invocations(words)
               if (ROOT / script).is_file()}
    with ThreadPoolExecutor(max_workers=4) as pool:  # each --help is a Python start-up
        list(pool.map(_usage, sorted(scripts)))
    for words in commands:
        for script, args in _invocations(words):
            assert (ROOT / script).is_file(), f"{script} of {shlex.join(words)} does not exist"
            for option in (a.split("=", 1)[0] for a in args if a.startswith("--")):
                assert re.search(rf"(^|[\s\[,]){re.escape(option)}\b", _usage(script)), (
                    f"{option} of {shlex.join(words)!r} is no option of {script}")

