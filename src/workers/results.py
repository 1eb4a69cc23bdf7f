"""Result stores: where a worker stages result bytes too large to travel inline.

A result of at most ``INLINE_LIMIT`` (8 KiB) JSON bytes travels inline in CompleteRun /
ResultPublished. A larger one is *staged* first: written to the store under an immutable,
per-attempt name, and then named by ``uri`` in CompleteRun. Staging is not publication: only
a ResultPublished event in the log makes a staged object canonical. A stale attempt's upload
simply stays unreferenced (docs/design.md §7: unreferenced uploads are allowed, missing
canonical objects are not).

The port (``ResultStore``):

* ``put(run_id, attempt, fence, data) -> uri`` — immutable: a name is never overwritten; a
  repeated put of the same bytes under the same name returns the same uri;
* ``get(uri, checksum=None) -> bytes`` — verified against the SHA-256 ``checksum`` (or the
  digest prefix in the name when none is given); ``ChecksumMismatch`` otherwise;
* ``list() -> [StagedObject]`` and ``delete(uri)`` — used by ``chronolog gc`` only.

``FilesystemResultStore(root)``: objects live at ``<root>/<run_id>/a<attempt>-f<fence>-<sha256
[:16]>``; the uri is ``results:<run_id>/a<attempt>-f<fence>-<sha16>`` (relative to the store,
so the data directory can move). A put writes a temp file, fsyncs it, then ``os.link``s it to
its final name — link fails if the name exists, so an object is never replaced, and a reader
never sees a partial object.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

INLINE_LIMIT = 8 * 1024
URI_SCHEME = "results:"
_NAME = re.compile(r"^a(?P<attempt>[0-9]+)-f(?P<fence>[0-9]+)-(?P<sha>[0-9a-f]{16})$")
_RUN_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")


class ResultStoreError(Exception):
    """A result store operation failed."""


class ChecksumMismatch(ResultStoreError):
    """The stored bytes do not hash to the expected SHA-256."""


class ObjectMissing(ResultStoreError):
    """No object under that uri."""


@dataclass(frozen=True)
class StagedObject:
    """One staged object: its uri, the attempt that staged it, and its age."""

    uri: str
    run_id: str
    attempt: int
    fence: int
    sha_prefix: str
    size: int
    mtime: float


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def object_key(run_id: str, attempt: int, fence: int, checksum: str) -> str:
    """The immutable per-attempt name of a staged object."""
    if not _RUN_ID.match(run_id) or run_id in (".", ".."):
        raise ResultStoreError(f"unusable run_id for a staged object: {run_id!r}")
    return f"{run_id}/a{attempt}-f{fence}-{checksum[:16]}"


def parse_uri(uri: str) -> tuple[str, int, int, str]:
    """``results:<run_id>/a<n>-f<n>-<sha16>`` -> (run_id, attempt, fence, sha16)."""
    if not uri.startswith(URI_SCHEME):
        raise ResultStoreError(f"not a result store uri: {uri!r}")
    key = uri[len(URI_SCHEME):]
    run_id, _, name = key.partition("/")
    match = _NAME.match(name)
    if not match or not _RUN_ID.match(run_id) or run_id in (".", ".."):
        raise ResultStoreError(f"malformed result uri: {uri!r}")
    return run_id, int(match["attempt"]), int(match["fence"]), match["sha"]


@runtime_checkable
class ResultStore(Protocol):
    """The result store port (one contract suite: tests/contract/test_result_store.py)."""

    async def put(self, run_id: str, attempt: int, fence: int, data: bytes) -> str: ...

    async def get(self, uri: str, checksum: str | None = None) -> bytes: ...

    async def exists(self, uri: str) -> bool: ...

    async def list(self) -> list[StagedObject]: ...

    async def delete(self, uri: str) -> bool: ...


class FilesystemResultStore:
    """Immutable staged objects under a directory (default ``<data dir>/results``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- paths ------------------------------------------------------------------------

    def path_of(self, uri: str) -> Path:
        run_id, attempt, fence, sha16 = parse_uri(uri)
        return self.root / run_id / f"a{attempt}-f{fence}-{sha16}"

    # -- sync implementations (run in a thread by the async API) -----------------------

    def put_sync(self, run_id: str, attempt: int, fence: int, data: bytes) -> str:
        checksum = sha256_hex(data)
        key = object_key(run_id, attempt, fence, checksum)
        final = self.root / key
        tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
        for _ in range(10):  # gc may remove an empty run directory between mkdir and open
            final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileNotFoundError:
                continue
        else:
            raise ResultStoreError(f"could not create a staging file under {final.parent}")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                # read-only (staged objects are immutable), and the owner's alone (a job's result)
                os.fchmod(f.fileno(), 0o400)
                os.fsync(f.fileno())
            try:
                os.link(tmp, final)  # never replaces an existing name
            except FileExistsError:
                existing = final.read_bytes()
                if sha256_hex(existing) != checksum:
                    raise ChecksumMismatch(
                        f"{key} exists with different bytes; staged objects are immutable"
                    ) from None
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        _fsync_dir(final.parent)
        return URI_SCHEME + key

    def get_sync(self, uri: str, checksum: str | None = None) -> bytes:
        path = self.path_of(uri)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ObjectMissing(uri) from None
        actual = sha256_hex(data)
        expected_prefix = parse_uri(uri)[3]
        if checksum is not None and actual != checksum:
            raise ChecksumMismatch(f"{uri}: sha256 {actual} != expected {checksum}")
        if not actual.startswith(expected_prefix):
            raise ChecksumMismatch(f"{uri}: sha256 {actual} does not match its name")
        return data

    def list_sync(self) -> list[StagedObject]:
        out: list[StagedObject] = []
        if not self.root.is_dir():
            return out
        for run_dir in self.root.iterdir():
            if not run_dir.is_dir() or not _RUN_ID.match(run_dir.name):
                continue
            for f in run_dir.iterdir():
                match = _NAME.match(f.name)
                if not match:
                    continue  # temp files and strangers are not staged objects
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                out.append(StagedObject(
                    uri=f"{URI_SCHEME}{run_dir.name}/{f.name}", run_id=run_dir.name,
                    attempt=int(match["attempt"]), fence=int(match["fence"]),
                    sha_prefix=match["sha"], size=st.st_size, mtime=st.st_mtime,
                ))
        return out

    def delete_sync(self, uri: str) -> bool:
        path = self.path_of(uri)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        try:
            path.parent.rmdir()  # only when empty
        except OSError:
            pass
        return True

    # -- the port -----------------------------------------------------------------------

    async def put(self, run_id: str, attempt: int, fence: int, data: bytes) -> str:
        return await asyncio.to_thread(self.put_sync, run_id, attempt, fence, data)

    async def get(self, uri: str, checksum: str | None = None) -> bytes:
        return await asyncio.to_thread(self.get_sync, uri, checksum)

    async def exists(self, uri: str) -> bool:
        return await asyncio.to_thread(self.path_of(uri).is_file)

    async def list(self) -> list[StagedObject]:
        return await asyncio.to_thread(self.list_sync)

    async def delete(self, uri: str) -> bool:
        return await asyncio.to_thread(self.delete_sync, uri)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
