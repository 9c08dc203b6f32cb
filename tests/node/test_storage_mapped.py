"""Mapped blobs: read-only arrays over the file, verified once per file identity."""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpnode.node.storage as storage
from dpnode.node.storage import CorruptBlobError, FileBlobStore, array_to_bytes


@pytest.fixture(autouse=True)
def _map_every_blob(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Map blobs of any size here (the node maps those of MAP_BYTES and more)."""
    if "small" not in request.node.name:
        monkeypatch.setattr(storage, "MAP_BYTES", 0)


def _counting_sha256(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the SHA-256 hashers the store makes (one per verification)."""
    calls: list[int] = []
    real = hashlib.sha256

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(storage.hashlib, "sha256", counted)
    return calls


def _root(array: np.ndarray[Any, Any]) -> object:
    """What finally holds an array's memory."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_an_array_is_mapped_read_only_not_copied(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    values = np.arange(12.0).reshape(6, 2)
    digest = store.put(array_to_bytes(values))
    mapped = store.open_array(digest, "float64", (6, 2))
    np.testing.assert_array_equal(mapped, values)
    assert isinstance(_root(mapped), mmap.mmap)  # a view of the file, not bytes in memory
    with pytest.raises(ValueError, match="read-only"):
        mapped[0, 0] = 1.0
    with pytest.raises(ValueError, match="WRITEABLE"):
        mapped.setflags(write=True)
    empty = store.put(b"")
    assert store.open_array(empty, "int64", (0, 3)).shape == (0, 3)


def test_a_file_is_hashed_once_per_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileBlobStore(tmp_path)
    digest = store.put(array_to_bytes(np.arange(1000.0)))
    path = tmp_path / digest[:2] / digest
    calls = _counting_sha256(monkeypatch)
    # just written: hashed on every mapping until its times are old enough to trust
    store.open_array(digest, "float64", (1000,))
    store.open_array(digest, "float64", (1000,))
    assert len(calls) == 2
    monkeypatch.setattr(storage, "RECENT_NS", 0)
    time.sleep(0.05)  # past the file clock's tick
    store.open_array(digest, "float64", (1000,))
    assert len(calls) == 3
    for _ in range(3):
        np.testing.assert_array_equal(
            store.open_array(digest, "float64", (1000,)), np.arange(1000.0)
        )
    assert len(calls) == 3  # remembered: no hash
    # altered in place, same size: the ctime moved, so it is hashed again, and refused
    time.sleep(0.05)
    with path.open("r+b") as f:
        f.seek(8)
        f.write(np.float64(7.0).tobytes())
    with pytest.raises(CorruptBlobError, match="does not match its hash"):
        store.open_array(digest, "float64", (1000,))
    assert len(calls) == 4


def test_a_swapped_or_resized_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "RECENT_NS", 0)
    store = FileBlobStore(tmp_path)
    a = store.put(array_to_bytes(np.zeros(64)))
    b = store.put(array_to_bytes(np.ones(64)))
    time.sleep(0.05)
    store.open_array(a, "float64", (64,))  # verified and remembered
    pa, pb = (tmp_path / d[:2] / d for d in (a, b))
    os.replace(pb, pa)  # another blob's file under a's name: a new inode
    with pytest.raises(CorruptBlobError, match="does not match its hash"):
        store.open_array(a, "float64", (64,))
    pa.write_bytes(b"\x00" * 8)
    with pytest.raises(CorruptBlobError, match="holds 8 bytes, not the 512"):
        store.open_array(a, "float64", (64,))
    pa.unlink()
    with pytest.raises(CorruptBlobError, match="is missing"):
        store.open_array(a, "float64", (64,))


def test_a_small_blob_is_read_into_the_cache_not_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileBlobStore(tmp_path, cache_bytes=1 << 20)
    digest = store.put(array_to_bytes(np.arange(8, dtype=np.int32)))
    calls = _counting_sha256(monkeypatch)
    array = store.open_array(digest, "int32", (2, 4))
    again = store.open_array(digest, "int32", (8,))
    assert len(calls) == 1 and store.cache.digests() == [digest]  # verified once, kept
    assert isinstance(_root(array), bytes) and not array.flags.writeable
    np.testing.assert_array_equal(again, np.arange(8))
    with pytest.raises(CorruptBlobError, match="holds 32 bytes, not the 64"):
        store.open_array(digest, "int64", (8,))


def test_delete_forgets_the_verified_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RECENT_NS", 0)
    store = FileBlobStore(tmp_path)
    digest = store.put(b"\x01" * 16)
    store.open_array(digest, "uint8", (16,))
    store.delete(digest)
    with pytest.raises(CorruptBlobError, match="is missing"):
        store.open_array(digest, "uint8", (16,))
    calls = _counting_sha256(monkeypatch)
    assert store.put(b"\x01" * 16) == digest  # put hashes the data once
    store.open_array(digest, "uint8", (16,))
    assert len(calls) == 2
