"""``make chaos`` in its short variant: faults under load on private services, every
guarantee checked after each (``scripts/chaos.py``).

``--short --log sqlite``: PostgreSQL restarted, kill -9 of each of the seven processes (2
processors, 2 workers, the projector, the effect runner, the API), and the embedded log's
disk full, each under 20 schedules ``every 1s`` with misfire ``all``. Every row must be
clean: nothing lost or doubled, ``chronolog audit`` passing, the projection equal to a
replay, no process exiting by itself, each fault recovered from. The scenarios that need a
broker restart run under ``make chaos`` (a JVM start is most of a short run's budget); the
broker outage of each process is in ``tests/integration/test_readiness_outages.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # about a minute and a half: faults under load


def test_the_short_chaos_run_is_clean_in_every_row(tmp_path: Path) -> None:
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--short", "--log", "sqlite",
         "--json", str(report)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    rows = json.loads(report.read_text()) if report.exists() else []
    summary = done.stdout + done.stderr[-4000:]
    assert [r["scenario"] for r in rows] == ["postgres-restart", "kill-processes",
                                             "disk-full"], summary
    for row in rows:
        assert row["runs"] > 0, row
        assert (row["lost"], row["doubled"]) == (0, 0), row
        assert (row["audit"], row["replay"], row["crashes"]) == ("pass", "equal", 0), row
        assert row["recover_s"] is not None and not row["error"], row
    assert done.returncode == 0, summary
