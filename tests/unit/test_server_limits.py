"""The API server's bounds from the environment: defaults, values, and errors naming the
variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chronolog.api.server import ServerLimits, server_limits

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")


def test_defaults_and_values() -> None:
    assert server_limits({}) == ServerLimits(10.0, 30.0, 1000, 43200.0, 1800.0, False)
    got = server_limits({"CHRONOLOG_HEADER_TIMEOUT": "2.5", "CHRONOLOG_MAX_CONNECTIONS": "50",
                         "CHRONOLOG_SESSION_IDLE": "60", "CHRONOLOG_SECURE_COOKIES": "1"})
    assert (got.header_timeout, got.max_connections, got.session_idle, got.secure_cookies) \
        == (2.5, 50, 60.0, True)


@pytest.mark.parametrize("variable,value", [
    ("CHRONOLOG_HEADER_TIMEOUT", "soon"), ("CHRONOLOG_BODY_TIMEOUT", "0"),
    ("CHRONOLOG_MAX_CONNECTIONS", "1.5"), ("CHRONOLOG_SESSION_MAX_AGE", "-1"),
    ("CHRONOLOG_SECURE_COOKIES", "yes"),
])
def test_a_wrong_value_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable):
        server_limits({variable: value})


@pytest.mark.parametrize("command", ["api", "dev"])
def test_the_api_and_dev_commands_refuse_a_wrong_bound_with_exit_2(
    command: str, tmp_path: Path,
) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")},
           "CHRONOLOG_DATA_DIR": str(tmp_path), "CHRONOLOG_HEADER_TIMEOUT": "soon"}
    done = subprocess.run([CHRONOLOG, command], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert b"CHRONOLOG_HEADER_TIMEOUT: expected a number, got 'soon'" in done.stderr
