"""Which result locations an effect may deliver (``resolve_payload``), on a real directory:
only ``results:`` objects and files inside the result store, with a SHA-256 checksum that is
verified; a location outside the store is refused with one message whether it exists or not."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from chronolog.domain import messages as m
from chronolog.effect_adapters.payload import OUTSIDE_THE_STORE, PayloadError, resolve_payload
from chronolog.workers.results import FilesystemResultStore


def intent(uri: str, data: bytes | None = None, checksum: str | None = None) -> m.EffectIntended:
    digest = checksum if checksum is not None else hashlib.sha256(data or b"").hexdigest()
    return m.EffectIntended(effect_id="e1", run_id="r1", kind="webhook", checksum=digest,
                            uri=uri)


def resolve(i: m.EffectIntended, store: Any) -> Any:
    return asyncio.run(resolve_payload(i, store))


def refusal(i: m.EffectIntended, store: Any) -> PayloadError:
    with pytest.raises(PayloadError) as caught:
        resolve(i, store)
    return caught.value


@pytest.fixture
def store(tmp_path: Path) -> FilesystemResultStore:
    root = tmp_path / "results"
    root.mkdir()
    return FilesystemResultStore(root)


@pytest.fixture
def secret(tmp_path: Path) -> tuple[Path, bytes]:
    data = b'[tenants.acme]\ntokens = ["s3cret"]\n'
    path = tmp_path / "tenants.toml"
    path.write_bytes(data)
    return path, data


def test_a_file_inside_the_store_with_its_checksum_is_delivered(
        store: FilesystemResultStore) -> None:
    data = orjson.dumps({"total": 57})
    (store.root / "r1").mkdir()
    (store.root / "r1" / "out.json").write_bytes(data)
    path = store.root / "r1" / "out.json"
    assert resolve(intent(f"file://{path}", data), store) == {"total": 57}
    assert resolve(intent(str(path), data), store) == {"total": 57}


def test_a_file_outside_the_store_is_refused_and_never_read(
        store: FilesystemResultStore, secret: tuple[Path, bytes]) -> None:
    path, data = secret
    for uri in (f"file://{path}", str(path)):
        err = refusal(intent(uri, data), store)  # even with its right checksum
        assert err.permanent and str(err) == OUTSIDE_THE_STORE
        assert "s3cret" not in str(err)


def test_existing_and_missing_files_outside_the_store_get_the_same_answer(
        store: FilesystemResultStore, secret: tuple[Path, bytes], tmp_path: Path) -> None:
    path, data = secret
    there = refusal(intent(str(path), data), store)
    missing = refusal(intent(str(tmp_path / "no-such-file"), data), store)
    assert (str(there), there.permanent) == (str(missing), missing.permanent)


def test_dot_dot_and_symbolic_links_do_not_lead_out_of_the_store(
        store: FilesystemResultStore, secret: tuple[Path, bytes]) -> None:
    path, data = secret
    (store.root / "r1").mkdir()
    os.symlink(path, store.root / "r1" / "link.json")
    os.symlink(path.parent, store.root / "dir-link")
    for uri in (f"{store.root}/r1/../../{path.name}", f"file://{store.root}/r1/link.json",
                f"{store.root}/dir-link/{path.name}", str(store.root)):
        assert str(refusal(intent(uri, data), store)) == OUTSIDE_THE_STORE, uri


def test_without_a_result_store_no_file_location_is_read(
        secret: tuple[Path, bytes]) -> None:
    path, data = secret
    assert str(refusal(intent(str(path), data), None)) == OUTSIDE_THE_STORE


@pytest.mark.parametrize("checksum", ["", "md5:abc", "sha256:xyz", "A" * 64, "0" * 63])
def test_a_checksum_that_is_not_sha256_hex_is_refused_before_anything_is_read(
        store: FilesystemResultStore, checksum: str) -> None:
    data = b'{"a": 1}'
    (store.root / "r1").mkdir()
    (store.root / "r1" / "out.json").write_bytes(data)
    err = refusal(intent(str(store.root / "r1" / "out.json"), checksum=checksum), store)
    assert err.permanent and "SHA-256" in str(err)
    staged = asyncio.run(store.put("r1", 1, 1, data))
    assert "SHA-256" in str(refusal(intent(staged, checksum=checksum), store))


def test_a_checksum_mismatch_fails_and_names_only_the_location_given(
        store: FilesystemResultStore) -> None:
    (store.root / "r1").mkdir()
    path = store.root / "r1" / "out.json"
    path.write_bytes(b'{"a": 1}')
    err = refusal(intent(str(path), b"other bytes"), store)
    assert err.permanent and "does not match" in str(err)
    staged = asyncio.run(store.put("r1", 1, 1, b'{"a": 1}'))
    assert refusal(intent(staged, b"other bytes"), store).permanent
