"""The S3 blob store against a real S3 protocol server on loopback.

The server is s3rver (an S3 emulator for Node.js, installed by ``scripts/ensure-s3rver``):
no S3-compatible server that is not an emulator installs from PyPI, Debian or npm here.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.settings import Settings
from dpnode.node.storage import CorruptBlobError
from dpnode.node.storage_s3 import S3BlobStore
from tests.conftest import login, make_user
from tests.node.conftest import upload_ok
from tests.node.frames import read_frame

S3RVER = (
    Path(__file__).resolve().parents[2] / ".cache" / "s3rver" / "node_modules" / ".bin" / "s3rver"
)
KEY = "S3RVER"  # s3rver's fixed credentials


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not S3RVER.exists():
        if os.environ.get("CI"):
            pytest.fail("s3rver is required in CI: run scripts/ensure-s3rver")
        pytest.skip("s3rver not installed (scripts/ensure-s3rver)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    directory = tmp_path_factory.mktemp("s3")
    server = subprocess.Popen(
        [str(S3RVER), "-d", str(directory), "-a", "127.0.0.1", "-p", str(port), "--silent"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()


def store(endpoint: str, cache: Path, bucket: str = "blobs") -> S3BlobStore:
    return S3BlobStore.connect(
        endpoint, bucket, cache, access_key=KEY, secret_key=KEY, secure=False, prefix="v1/"
    )


def test_streamed_multipart_put_and_verified_reads(s3_endpoint: str, tmp_path: Path) -> None:
    writer = store(s3_endpoint, tmp_path / "a")
    writer.part_bytes = 5 * 1024 * 1024  # S3's smallest part: three parts for 12 MiB
    data = np.random.default_rng(0).bytes(12 * 1024 * 1024)
    pieces = (data[i : i + 1_000_000] for i in range(0, len(data), 1_000_000))
    trace = io.StringIO()
    writer.client.trace_on(trace)
    digest = writer.put_stream(pieces)
    writer.client.trace_off()
    assert digest == hashlib.sha256(data).hexdigest()
    assert writer.client.stat_object("blobs", f"v1/{digest}").size == len(data)
    parts = set(re.findall(r"partNumber=(\d+)", trace.getvalue()))
    assert parts == {"1", "2", "3"}  # a multipart upload, a part at a time
    # Another node (an empty cache) downloads it once, verified, and keeps it.
    reader = store(s3_endpoint, tmp_path / "b")
    assert reader.get(digest) == data
    path = reader.local_path(digest)
    assert path == tmp_path / "b" / digest[:2] / digest and path.read_bytes() == data
    assert writer.put(data) == digest  # already there: nothing sent again
    writer.delete(digest)
    fresh = store(s3_endpoint, tmp_path / "c")
    with pytest.raises(CorruptBlobError, match="missing from bucket"):
        fresh.get(digest)


def test_another_node_maps_a_large_column_it_downloads(s3_endpoint: str, tmp_path: Path) -> None:
    column = np.random.default_rng(1).random(3 * 1024 * 1024)  # 24 MiB: over MAP_BYTES
    digest = store(s3_endpoint, tmp_path / "a", bucket="mapped").put(column.tobytes())
    reader = store(s3_endpoint, tmp_path / "b", bucket="mapped")
    array = reader.open_array(digest, "float64", column.shape)
    assert not array.flags.writeable
    np.testing.assert_array_equal(array, column)
    assert (tmp_path / "b" / digest[:2] / digest).exists()  # downloaded once, kept


def test_an_altered_object_is_detected(s3_endpoint: str, tmp_path: Path) -> None:
    s3 = store(s3_endpoint, tmp_path / "a", bucket="altered")
    digest = s3.put(b"\x00" * 64)
    s3.client.put_object("altered", f"v1/{digest}", io.BytesIO(b"\x01" * 64), 64)
    other = store(s3_endpoint, tmp_path / "b", bucket="altered")
    with pytest.raises(CorruptBlobError, match="does not match its hash: the object was altered"):
        other.get(digest)
    assert not list((tmp_path / "b").rglob("*" + digest))  # nothing kept
    with pytest.raises(ValueError, match="not a SHA-256 digest"):
        other.get("../../etc/passwd")


def test_a_node_on_the_s3_store(s3_endpoint: str, tmp_path: Path, database_url: str) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        argon2_memory_kib=8 * 1024,
        blob_store="s3",
        s3_endpoint=s3_endpoint,
        s3_bucket="node",
        s3_access_key=KEY,
        s3_secret_key=KEY,  # type: ignore[arg-type]
        s3_secure=False,
    )
    context = NodeContext.from_settings(settings)
    try:
        assert isinstance(context.store, S3BlobStore)
        make_user(context, "owner@example.org", "data_owner")
        with TestClient(create_app(context=context)) as http:
            headers = login(http, "owner@example.org")
            x = np.linspace(0, 1, 1000)
            upload_ok(http, headers, "on-s3", {"x": x}, bounds={"x": (0, 1)})
            keys = [o.object_name for o in context.store.client.list_objects("node")]
            assert len(keys) == 1
            for cached in (tmp_path / "data" / "blobs").rglob("*"):  # a node with no cache
                if cached.is_file():
                    cached.unlink()
            context.store.cache.discard(keys[0])
            body: Any = http.get("/api/v1/datasets/on-s3/data", headers=headers).content
            assert np.array_equal(read_frame(body)[1]["x"], x)
    finally:
        context.close()
