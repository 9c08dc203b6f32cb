"""The blob store: content addressing, verification on every read, and what the API makes of it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from dpnode.node.storage import (
    CorruptBlobError,
    FileBlobStore,
    array_chunks,
    array_from_bytes,
    array_to_bytes,
    file_chunks,
)
from tests.node.conftest import blob_files, refused, upload_model, upload_ok
from tests.node.frames import read_frame

STORAGE_ERROR = "stored data failed its integrity check; tell the node's operator"


def test_put_get_and_content_addressing(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    digest = store.put(b"hello")
    assert digest == hashlib.sha256(b"hello").hexdigest()
    assert (tmp_path / "blobs" / digest[:2] / digest).read_bytes() == b"hello"
    assert store.put(b"hello") == digest
    assert store.get(digest) == b"hello"
    assert [p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == [digest]
    store.delete(digest)
    store.delete(digest)  # deleting twice is harmless
    with pytest.raises(CorruptBlobError, match=f"blob {digest} is missing"):
        store.get(digest)


def test_altered_bytes_are_detected(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    digest = store.put(b"\x00" * 64)
    (tmp_path / digest[:2] / digest).write_bytes(b"\x00" * 63 + b"\x01")
    with pytest.raises(CorruptBlobError, match="does not match its hash: the file was altered"):
        store.get(digest)


@pytest.mark.parametrize("digest", ["../../etc/passwd", "A" * 64, "ab" * 31, "g" * 64])
def test_only_sha256_digests_name_files(tmp_path: Path, digest: str) -> None:
    store = FileBlobStore(tmp_path)
    with pytest.raises(ValueError, match="not a SHA-256 digest"):
        store.get(digest)
    with pytest.raises(ValueError, match="not a SHA-256 digest"):
        store.delete(digest)


def test_arrays_travel_as_raw_bytes_with_dtype_and_shape() -> None:
    array = np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2]  # not contiguous
    data = array_to_bytes(array)
    assert data == np.ascontiguousarray(array).tobytes()
    back = array_from_bytes(data, "int16", (3, 2))
    np.testing.assert_array_equal(back, array)
    assert not back.flags.writeable


def _only_blob(context: NodeContext) -> Path:
    (path,) = blob_files(context)
    return path


def test_a_dataset_blob_altered_on_disk_is_a_storage_error_not_wrong_data(
    http: TestClient, context: NodeContext, owner_h: dict[str, str]
) -> None:
    upload_ok(http, owner_h, "d", {"x": np.array([1.0, 2.0])}, bounds={"x": (0, 5)})
    path = _only_blob(context)
    path.write_bytes(np.array([1.0, 3.0]).tobytes())  # same size, different values
    detail = refused(http.get("/api/v1/datasets/d/data", headers=owner_h), 500, "storage_error")
    assert detail == STORAGE_ERROR
    path.unlink()
    detail = refused(http.get("/api/v1/datasets/d/data", headers=owner_h), 500, "storage_error")
    assert detail == STORAGE_ERROR
    # The metadata is still served, and so are other requests.
    assert http.get("/api/v1/datasets/d", headers=owner_h).status_code == 200


def test_altered_mock_and_weights_are_detected_too(
    http: TestClient, context: NodeContext, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    upload_ok(
        http,
        owner_h,
        "d",
        {"x": np.array([1.0, 2.0])},
        bounds={"x": (0, 5)},
        mock={"x": np.array([4.0])},
    )
    mock_path = next(p for p in blob_files(context) if p.stat().st_size == 8)
    mock_path.write_bytes(np.array([5.0]).tobytes())
    response = http.get("/api/v1/datasets/d/mock", headers=ds_h)
    assert refused(response, 500, "storage_error") == STORAGE_ERROR

    before = blob_files(context)
    response = upload_model(http, owner_h, "m", {"w": np.ones(3, dtype=np.float32)}, public=True)
    assert response.status_code == 201, response.text
    (weights_path,) = blob_files(context) - before
    weights_path.write_bytes(np.zeros(3, dtype=np.float32).tobytes())
    response = http.get("/api/v1/models/m/weights", headers=ds_h)
    assert refused(response, 500, "storage_error") == STORAGE_ERROR


def test_identical_arrays_are_stored_once(
    http: TestClient, context: NodeContext, owner_h: dict[str, str]
) -> None:
    column = np.linspace(0, 1, 50)
    upload_ok(
        http,
        owner_h,
        "a",
        {"x": column, "y": column.copy()},
        bounds={"x": (0, 1), "y": (0, 1)},
        mock={"x": column, "y": column},
    )
    upload_ok(http, owner_h, "b", {"z": column}, bounds={"z": (0, 1)})
    response = upload_model(http, owner_h, "m", {"w": column})
    assert response.status_code == 201, response.text
    assert len(blob_files(context)) == 1
    # Deleting the datasets keeps the bytes the model still uses, and the model reads them.
    for name in ("a", "b"):
        assert http.delete(f"/api/v1/datasets/{name}", headers=owner_h).status_code == 204
    assert len(blob_files(context)) == 1
    weights = http.get("/api/v1/models/m/weights", headers=owner_h)
    assert read_frame(weights.content)[1]["w"].tobytes() == column.tobytes()
    assert http.delete("/api/v1/models/m", headers=owner_h).status_code == 204
    assert blob_files(context) == set()


def test_a_blob_is_read_and_verified_once_then_served_from_memory(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path, cache_bytes=1 << 20)
    digest = store.put(b"\x01" * 64)
    assert store.cache.digests() == []  # put does not cache: the first read verifies
    assert store.get(digest) == b"\x01" * 64
    assert store.cache.digests() == [digest]
    # the verified copy is what is used: an alteration on disk cannot change results
    (tmp_path / digest[:2] / digest).write_bytes(b"\x02" * 64)
    assert store.get(digest) == b"\x01" * 64
    # ... and is detected once the blob is read from disk again
    store.cache.discard(digest)
    with pytest.raises(CorruptBlobError, match="does not match its hash"):
        store.get(digest)
    store.delete(digest)
    assert store.cache.digests() == []


def test_the_cache_is_bounded_and_evicts_the_least_recently_used(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path, cache_bytes=250)
    a, b, c, big = (store.put(bytes([i]) * n) for i, n in ((1, 100), (2, 100), (3, 100), (4, 251)))
    store.get(a)
    store.get(b)
    store.get(a)  # b is now the least recently used
    store.get(c)
    assert sorted(store.cache.digests()) == sorted([a, c])
    assert store.cache.size == 200
    assert store.get(big) == bytes([4]) * 251  # larger than the budget: read, never cached
    assert big not in store.cache.digests() and store.cache.size <= 250
    off = FileBlobStore(tmp_path, cache_bytes=0)
    off.get(a)
    assert off.cache.digests() == []


def test_arrays_of_cached_blobs_are_read_only(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path, cache_bytes=1 << 20)
    digest = store.put(array_to_bytes(np.arange(6.0)))
    first = array_from_bytes(store.get(digest), "float64", (2, 3))
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 7.0
    with pytest.raises(ValueError, match="WRITEABLE"):
        first.setflags(write=True)
    second = array_from_bytes(store.get(digest), "float64", (6,))
    np.testing.assert_array_equal(second, np.arange(6.0))


def test_the_cache_is_safe_under_concurrent_readers(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = FileBlobStore(tmp_path, cache_bytes=1000)
    blobs = {store.put(bytes([i]) * 300): bytes([i]) * 300 for i in range(8)}
    digests = list(blobs) * 25

    def read(d: str) -> bool:
        return store.get(d) == blobs[d]

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(read, digests))
    cached = store.cache.digests()
    assert len(cached) == len(set(cached)) <= 3
    assert store.cache.size == 300 * len(cached) <= 1000


def test_put_stream_hashes_chunks_as_they_come(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    chunks = [b"ab", memoryview(b"cde"), b"", b"f" * 1000]
    digest = store.put_stream(iter(chunks))
    whole = b"".join(bytes(c) for c in chunks)
    assert digest == hashlib.sha256(whole).hexdigest() == store.put(whole)
    assert store.get(digest) == whole
    assert [p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == [digest]


def test_a_failed_stream_leaves_nothing(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)

    def chunks() -> Iterator[bytes]:
        yield b"partial"
        raise OSError("connection lost")

    with pytest.raises(OSError, match="connection lost"):
        store.put_stream(chunks())
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_staged_blob_is_in_the_store_only_once_kept(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)

    def files() -> set[str]:
        return {p.name for p in tmp_path.rglob("*") if p.is_file()}

    staged = store.stage(iter([b"abc", b"def"]))
    assert staged.digest == hashlib.sha256(b"abcdef").hexdigest()
    assert files() == {staged.path.name} and staged.path.name.startswith(".tmp-")
    claimed: list[str] = []
    assert store.keep(staged, claim=claimed.append) == staged.digest == claimed[0]
    assert files() == {staged.digest} and store.get(staged.digest) == b"abcdef"
    again = store.stage([b"abcdef"])  # the same bytes: the stored copy stays, this one goes
    assert store.keep(again) == staged.digest and files() == {staged.digest}
    dropped = store.stage([b"other"])
    store.discard(dropped)
    assert files() == {staged.digest}

    def refuse(digest: str) -> None:
        raise RuntimeError("not now")

    with pytest.raises(RuntimeError, match="not now"):
        store.keep(store.stage([b"refused"]), claim=refuse)
    assert files() == {staged.digest}


def test_files_and_arrays_stream_in_pieces(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    source = tmp_path / "source.bin"
    source.write_bytes(bytes(range(256)) * 100)
    with source.open("rb") as f:
        pieces = list(file_chunks(f, 1000))
    assert [len(p) for p in pieces] == [1000] * 25 + [600]
    with source.open("rb") as f:
        assert store.put_stream(file_chunks(f, 1000)) == store.put(source.read_bytes())
    array = np.arange(60, dtype=np.float64).reshape(10, 6)[:, ::2]  # not contiguous
    pieces = list(array_chunks(array, 50))
    assert len(pieces) == 5 and all(len(p) == 48 for p in pieces)  # two rows of 24 bytes
    assert store.put_stream(array_chunks(array, 50)) == store.put(array_to_bytes(array))
    assert list(array_chunks(np.zeros((0, 3)))) == []
