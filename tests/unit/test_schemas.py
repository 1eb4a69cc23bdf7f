"""The committed JSON Schemas under schemas/ match the pydantic models (no drift)."""

from __future__ import annotations

from pathlib import Path

from chronolog.schemagen import render_all

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schemas_match_the_models() -> None:
    expected = render_all()
    on_disk = {
        str(p.relative_to(ROOT / "schemas")): p.read_text()
        for p in (ROOT / "schemas").rglob("*.json")
        if "api" not in p.parts
    }
    missing = sorted(set(expected) - set(on_disk))
    extra = sorted(set(on_disk) - set(expected))
    changed = sorted(k for k in expected if k in on_disk and on_disk[k] != expected[k])
    assert (missing, extra, changed) == ([], [], []), "run `make schemas` and commit"


def test_one_schema_per_command_and_event() -> None:
    names = render_all()
    assert sum(1 for k in names if k.startswith("commands/")) == 31
    assert sum(1 for k in names if k.startswith("events/")) == 51
