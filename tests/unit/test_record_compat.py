"""Records written before the compact wire format (docs/design.md, "Wire format") still read.

``fixtures/records_v1.jsonl`` holds real records written by chronolog before the compact
format (one of each kind a ``bench/storage.py`` run writes: events, commands, replies, ready
assignments), each with the values the decoder of that time gave. Every reader decodes
through the codec, so the codec giving those values is every reader giving them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chronolog.domain import codec

FIXTURE = Path(__file__).parent / "fixtures" / "records_v1.jsonl"
RECORDS = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line]
# members of a spec added since the fixture was written, with the value an old record
# decodes to (their default): compared as such, then left out of the comparison below
SPEC_ADDED_SINCE = {"concurrency": None, "exclude": [], "labels": {}}
# members of an event's payload added since, per type, likewise
PAYLOAD_ADDED_SINCE = {"OccurrenceMaterialized": {"permit_key": None, "permit_limit": None}}


def decoded(topic: str, key: str, value: bytes) -> Any:
    if topic == "events":
        return _without_added(codec.decode_event(value).model_dump(mode="json"))
    if topic == "commands":
        return _without_added(codec.decode_command(value).model_dump(mode="json"))
    if topic == "replies":
        return codec.decode_reply(value).model_dump(mode="json")
    return codec.decode_assignment(value, key.encode())


def _without_added(doc: dict[str, Any]) -> dict[str, Any]:
    payload = doc.get("payload", {})
    for name, default in PAYLOAD_ADDED_SINCE.get(payload.get("type", ""), {}).items():
        assert payload.pop(name) == default
    spec = payload.get("spec")
    if isinstance(spec, dict):
        for name, default in SPEC_ADDED_SINCE.items():
            assert spec.pop(name) == default
    return doc


def test_the_fixture_has_every_kind_of_record() -> None:
    kinds = {r["topic"] for r in RECORDS}
    assert kinds == {"events", "commands", "replies", "ready.default"}
    assert len({r["decoded"].get("type") for r in RECORDS if r["topic"] == "events"}) >= 5


def _name(record: dict[str, Any]) -> str:
    return f"{record['topic']}-{record['decoded'].get('type', '')}"


@pytest.mark.parametrize("record", RECORDS, ids=_name)
def test_records_of_the_first_format_decode_to_the_values_they_had(record: dict[str, Any]) -> None:
    assert decoded(record["topic"], record["key"], record["value"].encode()) == record["decoded"]
