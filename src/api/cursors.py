"""The consistency token: an opaque text for ``partition -> next offset the projection must
reach`` that a write returns in ``X-Chronolog-Consistency`` and a read sends back to wait for
its own writes.

Every write also answers ``X-Chronolog-Visible``: ``true`` when the read model had passed
its events before the answer (reads without a token then see the write), ``false`` when the
bound (``visible_timeout``) passed first.

(The ``after`` cursors of paged lists belong to the read model, which the CLI shares:
``chronolog.queries.read_model``.)
"""

from __future__ import annotations

import base64
import binascii

import orjson

__all__ = ["CONSISTENCY_HEADER", "VISIBLE_HEADER", "decode_token", "encode_token"]

CONSISTENCY_HEADER = "X-Chronolog-Consistency"
VISIBLE_HEADER = "X-Chronolog-Visible"


def encode_token(required: dict[int, int]) -> str:
    """An opaque token for ``partition -> next offset the projection must reach``."""
    raw = orjson.dumps({"v": 1, "p": {str(p): n for p, n in sorted(required.items())}})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> dict[int, int]:
    """The requirement of a token; ``ValueError`` when it is not one of ours."""
    try:
        raw = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(raw, dict) or raw.get("v") != 1 or not isinstance(raw.get("p"), dict):
            raise ValueError("not a consistency token")
        out = {int(p): int(n) for p, n in raw["p"].items()}
    except (binascii.Error, orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
        raise ValueError("not a consistency token") from None
    if any(p < 0 or n < 0 for p, n in out.items()):
        raise ValueError("not a consistency token")
    return out
