"""Generate one JSON Schema per message under ``schemas/commands`` and ``schemas/events``.

``python -m chronolog.schemagen DIR`` (``make schemas``) writes them; the drift test
compares the committed files with ``render_all()``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from chronolog.api.app import openapi_json
from chronolog.domain.messages import (
    COMMAND_TYPES,
    EVENT_TYPES,
    CommandEnvelope,
    DeadLetter,
    EventEnvelope,
    Reply,
    ScheduleSpec,
)
from chronolog.domain.wire import CompactEventEnvelope


def _schema(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"


def render_all() -> dict[str, str]:
    """Relative path -> schema text for every message model."""
    out: dict[str, str] = {}
    for m in COMMAND_TYPES:
        out[f"commands/{m.__name__}.json"] = _schema(m)
    for m in EVENT_TYPES:
        out[f"events/{m.__name__}.json"] = _schema(m)
    out["envelopes/CommandEnvelope.json"] = _schema(CommandEnvelope)
    out["envelopes/EventEnvelope.json"] = _schema(EventEnvelope)
    out["envelopes/CompactEventEnvelope.json"] = _schema(CompactEventEnvelope)
    out["envelopes/Reply.json"] = _schema(Reply)
    out["envelopes/DeadLetter.json"] = _schema(DeadLetter)
    out["ScheduleSpec.json"] = _schema(ScheduleSpec)
    return out


def write_all(root: Path) -> list[Path]:
    written = []
    for sub in ("commands", "events", "envelopes"):
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.json"):
            old.unlink()
    for rel, text in render_all().items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        written.append(p)
    api = root / "api" / "openapi.json"
    api.parent.mkdir(parents=True, exist_ok=True)
    api.write_text(openapi_json())
    written.append(api)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")
    paths = write_all(target)
    print(f"wrote {len(paths)} schemas under {target}/")
