"""Resolve the result an effect delivers: inline in the intent, or a staged object.

``EffectIntended`` carries the canonical result of its run exactly as ResultPublished did:
``inline`` (at most 8 KiB of JSON) or ``uri`` + ``checksum``. A ``results:`` URI is read from
the result store (``chronolog.workers.results``). A ``file://`` URI or an absolute path is
read only when it lies inside the result store's directory once every symbolic link and
``..`` is resolved; anything else is refused with one message, whether or not the file
exists, so a result cannot be used to read the node's other files or to probe for them.
Every location needs a SHA-256 hex checksum, and the bytes are verified against it; a
mismatch names only the location it was given. JSON bytes become the decoded value; other
UTF-8 bytes a string; anything else is delivered base64-encoded as ``{"base64": ...}``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
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


OUTSIDE_THE_STORE = "the result location is not inside the result store"


def _read_inside(root: Path, path: Path) -> bytes:
    """The bytes of ``path`` when it resolves inside ``root`` (raises ``PayloadError``).

    The path is resolved first (symbolic links, ``..``) and compared with the resolved root;
    the final open refuses a symbolic link, so a link swapped in after the check is not
    followed. A location outside the root gets the same answer whether it exists or not."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root or real == real_root:
        raise PayloadError(OUTSIDE_THE_STORE, permanent=True)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as exc:
        raise PayloadError(f"canonical result missing: {path}", permanent=False) from exc
    except OSError as exc:
        raise PayloadError(f"{path}: {exc.strerror}", permanent=False) from exc
    with os.fdopen(fd, "rb") as f:
        return f.read()


async def resolve_payload(intent: m.EffectIntended, store: Any | None = None) -> Any:
    """The result value for ``intent`` (raises ``PayloadError``)."""
    if intent.uri is None:
        return intent.inline
    uri = intent.uri
    checksum = intent.checksum.removeprefix("sha256:")
    if not _SHA256.match(checksum):
        raise PayloadError("the result's checksum is not a SHA-256 hex digest", permanent=True)
    if uri.startswith("results:"):
        if store is None:
            raise PayloadError(f"{uri}: no result store configured", permanent=False)
        try:
            data = await store.get(uri, checksum)
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
    root = getattr(store, "root", None)
    if root is None:  # no store: no directory a location could be inside
        raise PayloadError(OUTSIDE_THE_STORE, permanent=True)
    data = await asyncio.to_thread(_read_inside, Path(root), path)
    if hashlib.sha256(data).hexdigest() != checksum:
        raise PayloadError(f"{uri}: sha256 does not match the result's checksum", permanent=True)
    return _decode(data)
