"""Resolve the result an effect delivers: inline in the intent, or a staged object.

``EffectIntended`` carries the canonical result of its run exactly as ResultPublished did:
``inline`` (at most 8 KiB of JSON) or ``uri`` + ``checksum``. A ``results:`` URI is read from
the result store (``chronolog.workers.results``), verified against the SHA-256 checksum; a
``file://`` URI or an absolute path is read directly and verified the same way when the
checksum is a SHA-256 hex digest. JSON bytes become the decoded value; other UTF-8 bytes a
string; anything else is delivered base64-encoded as ``{"base64": ...}``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import orjson

from chronolog.domain import messages as m
from chronolog.workers.results import ChecksumMismatch, ObjectMissing, ResultStoreError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class PayloadError(Exception):
    """The result could not be read (``permanent``: it will never be readable)."""

    def __init__(self, message: str, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def _decode(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


async def resolve_payload(intent: m.EffectIntended, store: Any | None = None) -> Any:
    """The result value for ``intent`` (raises ``PayloadError``)."""
    if intent.uri is None:
        return intent.inline
    uri = intent.uri
    checksum = intent.checksum.removeprefix("sha256:")
    if uri.startswith("results:"):
        if store is None:
            raise PayloadError(f"{uri}: no result store configured", permanent=False)
        try:
            data = await store.get(uri, checksum if _SHA256.match(checksum) else None)
        except ChecksumMismatch as exc:
            raise PayloadError(str(exc), permanent=True) from exc
        except ObjectMissing as exc:
            raise PayloadError(f"canonical result missing: {exc}", permanent=False) from exc
        except ResultStoreError as exc:
            raise PayloadError(str(exc), permanent=True) from exc
        return _decode(data)
    if uri.startswith("file://"):
        path = Path(unquote(urlparse(uri).path))
    elif uri.startswith("/"):
        path = Path(uri)
    else:
        raise PayloadError(f"unsupported result uri {uri!r}", permanent=True)
    try:
        data = await asyncio.to_thread(path.read_bytes)
    except FileNotFoundError as exc:
        raise PayloadError(f"canonical result missing: {path}", permanent=False) from exc
    except OSError as exc:
        raise PayloadError(f"{path}: {exc}", permanent=False) from exc
    if _SHA256.match(checksum) and hashlib.sha256(data).hexdigest() != checksum:
        raise PayloadError(f"{path}: sha256 does not match {checksum}", permanent=True)
    return _decode(data)
