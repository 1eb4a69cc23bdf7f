"""``--retention`` / ``CHRONOLOG_RETENTION`` on ``chronolog dev``, ``processor``,
``projector``, ``api`` and ``replay``, as real processes: a bad value is one line naming the
flag or the tenants-file field, exit 2, refused before the command touches a log or a
database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")


def _file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(body)
    return path


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return subprocess.run([CHRONOLOG, *args], capture_output=True, text=True, timeout=60,
                          env={**clean, "CHRONOLOG_DATA_DIR": str(tmp_path), **env})


@pytest.mark.parametrize("command", ["dev", "processor", "projector", "api", "replay"])
def test_a_bad_retention_flag_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    done = _run([command, "--retention", "forever"], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --retention: 'forever': "), lines
    done = _run([command], tmp_path, CHRONOLOG_RETENTION="0")
    assert (done.returncode, done.stderr.strip()) == (
        2, "error: CHRONOLOG_RETENTION: '0': must be positive")


def test_a_result_retention_past_the_flags_retention_stops_the_command(tmp_path: Path) -> None:
    tenants = _file(tmp_path, '[tenants.a]\ntokens = ["t"]\nresult_retention = "2h"\n')
    done = _run(["projector", "--tenants", str(tenants), "--retention", "1h"], tmp_path)
    assert (done.returncode, done.stderr.strip()) == (
        2, "error: tenants.a.result_retention: '7200s': must not exceed the tenant's "
           "retention (3600s)")
