"""The storage commands docs/performance.md gives name only options bench/storage.py has.

The benchmark itself is not run here (figures come from running it by hand); its command
lines are checked against its own ``--help``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_storage_commands_use_options_the_benchmark_has() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    section = text[text.index("## Storage per run"):]
    section = section[:section.index("\n## ", 1)]
    commands = [ln for ln in section.splitlines() if "bench/storage.py" in ln
                and ln.startswith(".venv/bin/python")]
    assert len(commands) >= 2
    usage = subprocess.run([sys.executable, "bench/storage.py", "--help"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    for line in commands:
        options = re.findall(r"\s(--[a-z-]+)", line.split("bench/storage.py", 1)[1])
        assert options, line
        for option in options:
            assert option in usage, f"{option} of {line!r} is no option of bench/storage.py"
