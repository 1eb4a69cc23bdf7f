"""Retention settings: the tenants file's ``retention`` / ``result_retention`` (parsed and
refused in chronolog.tenants) and the deployment's ``--retention`` / ``CHRONOLOG_RETENTION``
(one home: chronolog.cli.flags): bad values are one line naming the flag or field, exit 2.
The flag on each command, as real processes: tests/integration/test_retention_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chronolog.projections.retention import RetentionPolicy
from chronolog.settings import ConfigError
from chronolog.tenants import (
    DEFAULT_RESULT_RETENTION_S,
    DEFAULT_RETENTION_S,
    dev_tenants,
    load_tenants,
)

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
DAY = 86400.0


def _file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(body)
    return path


def test_the_tenants_file_sets_each_tenants_retention_and_the_defaults_apply(
        tmp_path: Path) -> None:
    tenants = load_tenants(_file(tmp_path, (
        '[tenants.a]\ntokens = ["t-a"]\nretention = "90s"\nresult_retention = "30s"\n'
        '[tenants.b]\ntokens = ["t-b"]\nretention = "2m"\n'
        '[tenants.c]\ntokens = ["t-c"]\n')))
    assert (tenants.retention("a", DAY), tenants.result_retention("a", DAY)) == (90.0, 30.0)
    # b: its own retention, and a result window capped by it (default 7 days)
    assert (tenants.retention("b", DAY), tenants.result_retention("b", DAY)) == (120.0, 120.0)
    # c: the deployment's retention, the default result window
    assert tenants.retention("c", 30 * DAY) == 30 * DAY
    assert tenants.result_retention("c", 30 * DAY) == DEFAULT_RESULT_RETENTION_S == 7 * DAY
    assert RetentionPolicy.of(tenants, 5 * DAY) == RetentionPolicy(5 * DAY, {"a": 90.0,
                                                                             "b": 120.0})
    assert RetentionPolicy.of(dev_tenants(), DEFAULT_RETENTION_S).window("default") == 30 * DAY


@pytest.mark.parametrize(("body", "message"), [
    ('retention = "soon"', r"^invalid tenants\.a\.retention 'soon': "),
    ('retention = "0s"', r"^invalid tenants\.a\.retention '0s': must be positive"),
    ('result_retention = -1', r"^invalid tenants\.a\.result_retention '-1': "),
    ('retention = "1d"\nresult_retention = "2d"',
     r"^invalid tenants\.a\.result_retention '2d': must not exceed tenants\.a\.retention '1d'"),
])
def test_a_bad_retention_in_the_tenants_file_is_refused_naming_tenant_and_field(
        tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_tenants(_file(tmp_path, f'[tenants.a]\ntokens = ["t"]\n{body}\n'))


def test_a_result_retention_longer_than_the_deployments_retention_is_refused(
        tmp_path: Path) -> None:
    tenants = load_tenants(_file(tmp_path, '[tenants.a]\ntokens = ["t"]\n'
                                           'result_retention = "3d"\n'))
    tenants.check_retention(30 * DAY)  # within the default
    with pytest.raises(ConfigError, match=r"^invalid tenants\.a\.result_retention '259200s': "
                                          r"must not exceed the tenant's retention \(86400s\)"):
        tenants.check_retention(DAY)


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return subprocess.run([CHRONOLOG, *args], capture_output=True, text=True, timeout=60,
                          env={**clean, "CHRONOLOG_DATA_DIR": str(tmp_path), **env})


DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


def test_the_deployment_docs_retention_example_and_command_are_what_chronolog_does(
        tmp_path: Path) -> None:
    """docs/deployment.md, "Tenants": the tenants-file example parses with its retention
    keys, and the retention command shown prints exactly what is shown, exit 2."""
    import re

    text = DEPLOYMENT.read_text()
    section = text[text.index("### Tenants"):text.index("### Limits")]
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    assert toml is not None
    tenants = load_tenants(_file(tmp_path, toml.group(1)))
    assert (tenants.retention("acme", DAY), tenants.result_retention("acme", DAY)) == (
        30 * DAY, 7 * DAY)
    blocks = re.findall(r"```console\n\$ (chronolog [^\n]*)\n(.*?)```", section, re.S)
    assert blocks
    for command, shown in blocks:
        done = _run(command.split()[1:], tmp_path)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == shown, command
