"""Contract suite of the ResultStore port, run against every adapter (the filesystem one).

Immutable per-attempt names, checksummed reads, idempotent re-put of the same bytes, listing
and deletion for gc, and concurrent puts that never expose a partial object.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from chronolog.workers.results import (
    ChecksumMismatch,
    FilesystemResultStore,
    ObjectMissing,
    ResultStore,
    ResultStoreError,
    parse_uri,
    sha256_hex,
)


@pytest.fixture(params=["filesystem"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "filesystem":
        return FilesystemResultStore(tmp_path / "results")
    raise AssertionError(request.param)


def test_adapter_implements_the_port(store: Any) -> None:
    assert isinstance(store, ResultStore)


async def test_put_then_get_returns_the_bytes_and_verifies_the_checksum(store: Any) -> None:
    data = b'{"rows": [1, 2, 3]}' * 1000
    uri = await store.put("r_abc", 1, 7, data)
    assert parse_uri(uri) == ("r_abc", 1, 7, sha256_hex(data)[:16])
    assert await store.get(uri, sha256_hex(data)) == data
    assert await store.get(uri) == data  # verified against the digest in the name
    with pytest.raises(ChecksumMismatch):
        await store.get(uri, sha256_hex(b"something else"))


async def test_names_are_per_attempt_and_fence(store: Any) -> None:
    data = b"x" * 9000
    a = await store.put("r_1", 1, 3, data)
    b = await store.put("r_1", 2, 5, data)
    assert a != b
    assert {o.uri for o in await store.list()} == {a, b}


async def test_a_repeated_put_of_the_same_bytes_is_idempotent(store: Any) -> None:
    data = b"y" * 10_000
    first = await store.put("r_2", 1, 1, data)
    again = await store.put("r_2", 1, 1, data)
    assert first == again
    assert len(await store.list()) == 1


async def test_objects_are_immutable_a_tampered_object_fails_verification(
    store: Any, tmp_path: Path
) -> None:
    data = b"z" * 10_000
    uri = await store.put("r_3", 1, 1, data)
    path = store.path_of(uri)
    os.chmod(path, 0o644)
    path.write_bytes(b"tampered")
    with pytest.raises(ChecksumMismatch):
        await store.get(uri)
    # a put under the same name with the original bytes does not silently "repair" it
    with pytest.raises(ChecksumMismatch):
        await store.put("r_3", 1, 1, data)


async def test_missing_object_and_bad_uris(store: Any) -> None:
    with pytest.raises(ObjectMissing):
        await store.get("results:r_4/a1-f1-0123456789abcdef")
    for bad in ("file:///etc/passwd", "results:../x/a1-f1-0123456789abcdef",
                "results:r_4/../../etc", "results:r_4/a1-f1-zz"):
        with pytest.raises(ResultStoreError):
            await store.get(bad)
    with pytest.raises(ResultStoreError):
        await store.put("../evil", 1, 1, b"x")


async def test_list_and_delete(store: Any) -> None:
    uri = await store.put("r_5", 2, 9, b"q" * 100)
    [obj] = await store.list()
    assert (obj.uri, obj.run_id, obj.attempt, obj.fence, obj.size) == (uri, "r_5", 2, 9, 100)
    assert await store.exists(uri)
    assert await store.delete(uri) is True
    assert not await store.exists(uri)
    assert await store.delete(uri) is False
    assert await store.list() == []


async def test_concurrent_puts_never_expose_partial_objects(store: Any) -> None:
    payloads = [bytes([i]) * (50_000 + i) for i in range(20)]

    async def put(i: int) -> str:
        return await store.put("r_6", i + 1, i + 1, payloads[i])

    async def reader(stop: asyncio.Event) -> int:
        checked = 0
        while not stop.is_set():
            for obj in await store.list():
                data = await store.get(obj.uri)  # raises on a partial object
                assert sha256_hex(data).startswith(obj.sha_prefix)
                checked += 1
            await asyncio.sleep(0)
        return checked

    stop = asyncio.Event()
    r = asyncio.create_task(reader(stop))
    uris = await asyncio.gather(*(put(i) for i in range(20)))
    stop.set()
    await r
    for i, uri in enumerate(uris):
        assert await store.get(uri, sha256_hex(payloads[i])) == payloads[i]
