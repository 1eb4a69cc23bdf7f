"""docs/security.md's tenants-file examples are real tenants files: each TOML block loads
(its other commands run in tests/integration: the data-directory check in test_node_files,
the ACL tables in tests/unit/test_kafka_acls.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chronolog.tenants import load_tenants

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BLOCKS = re.findall(r"```toml\n(.*?)```", DOCS.read_text(), re.S)


def test_the_security_guide_shows_tenants_files() -> None:
    assert BLOCKS


@pytest.mark.parametrize("block", BLOCKS)
def test_each_tenants_file_in_the_security_guide_loads(block: str, tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(block)
    tenants = load_tenants(path)
    assert tenants.tenants or tenants.operator_tokens
