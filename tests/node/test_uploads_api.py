"""Chunked, resumable uploads over HTTP: the layout, offsets, checksums, limits, finalize."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from tests.node.conftest import blob_files, refused, upload_ok, write_elsewhere
from tests.node.frames import read_frame

UPLOADS = "/api/v1/uploads"
JSON = {"Content-Type": "application/json"}


def stream(columns: dict[str, np.ndarray[Any, Any]], block_rows: int) -> bytes:
    """The byte stream of a table: each block of rows, every column's bytes for it."""
    rows = len(next(iter(columns.values())))
    out = bytearray()
    for start in range(0, rows, block_rows):
        for values in columns.values():
            out += np.ascontiguousarray(values[start : start + block_rows]).tobytes()
    return bytes(out)


def tensors(columns: dict[str, np.ndarray[Any, Any]], prefix: str) -> list[dict[str, Any]]:
    return [
        {"name": f"{prefix}/{k}", "dtype": v.dtype.name, "shape": list(v.shape[1:])}
        for k, v in columns.items()
    ]


def open_session(
    http: TestClient,
    headers: dict[str, str],
    name: str,
    columns: dict[str, np.ndarray[Any, Any]],
    block_rows: int,
    **declared: Any,
) -> dict[str, Any]:
    body = {
        "name": name,
        "columns": list(columns),
        "rows": len(next(iter(columns.values()))),
        "block_rows": block_rows,
        "tensors": tensors(columns, "data"),
        **declared,
    }
    response = http.post(UPLOADS, json=body, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def put(
    http: TestClient, headers: dict[str, str], upload_id: str, offset: int, chunk: bytes
) -> Any:
    digest = hashlib.sha256(chunk).hexdigest()
    return http.put(
        f"{UPLOADS}/{upload_id}",
        params={"offset": offset},
        content=chunk,
        headers=headers | {"X-Content-SHA256": digest},
    )


def send(
    http: TestClient, headers: dict[str, str], upload_id: str, data: bytes, chunk: int
) -> None:
    for offset in range(0, len(data), chunk):
        response = put(http, headers, upload_id, offset, data[offset : offset + chunk])
        assert response.status_code == 200, response.text
        assert response.json()["received"] == min(offset + chunk, len(data))


def table(rows: int, seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return {
        "income": rng.normal(50, 30, rows),
        "scan": rng.integers(0, 200, (rows, 2), dtype=np.int32),
        "smoker": rng.random(rows) < 0.3,
        "sex": rng.integers(0, 3, rows),  # category indices
        "pid": rng.integers(0, rows // 3, rows),
    }


DECLARED: dict[str, Any] = {
    "bounds": {"income": [0, 100], "scan": [0, 255]},
    "categories": {"sex": ["f", "m", "x"]},
    "subject_id": "pid",
    "clamp": ["income"],
}


def test_a_chunked_upload_stores_what_one_request_stores(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    columns = table(20_000)
    created = open_session(http, owner_h, "chunked", columns, 3_000, **DECLARED)
    data = stream(columns, 3_000)
    assert created["received"] == 0 and created["size"] == len(data)
    send(http, owner_h, created["id"], data, 77_777)  # chunks cut blocks anywhere
    response = http.post(f"{UPLOADS}/{created['id']}/finalize", headers=owner_h)
    assert response.status_code == 201, response.text
    chunked = response.json()
    whole = upload_ok(http, owner_h, "whole", dict(columns), **DECLARED)
    for key in ("row_count", "columns", "subject_count", "max_rows_per_subject"):
        assert chunked[key] == whole[key], key
    a = read_frame(http.get("/api/v1/datasets/chunked/data", headers=owner_h).content)[1]
    b = read_frame(http.get("/api/v1/datasets/whole/data", headers=owner_h).content)[1]
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    assert a["income"].max() <= 100 and a["income"].min() >= 0  # clamped
    # A repeated finalize (say, after a dropped answer) answers the same dataset.
    again = http.post(f"{UPLOADS}/{created['id']}/finalize", headers=owner_h)
    assert again.status_code == 201 and again.json()["id"] == chunked["id"]
    assert (
        http.get(f"{UPLOADS}/{created['id']}", headers=owner_h).json()["dataset_id"]
        == (chunked["id"])
    )


def test_mock_data_rides_after_the_data(http: TestClient, owner_h: dict[str, str]) -> None:
    columns = {"x": np.linspace(0, 1, 1000), "n": np.arange(1000, dtype=np.int16)}
    mock = {"x": np.full(10, 0.5), "n": np.arange(10, dtype=np.int16)}
    created = open_session(
        http,
        owner_h,
        "with-mock",
        columns,
        1000,
        bounds={"x": [0, 1], "n": [0, 1000]},
        mock_rows=10,
        tensors=tensors(columns, "data") + tensors(mock, "mock"),
    )
    send(http, owner_h, created["id"], stream(columns, 1000) + stream(mock, 1000), 4096)
    body = http.post(f"{UPLOADS}/{created['id']}/finalize", headers=owner_h).json()
    assert body["has_mock"] and body["mock_row_count"] == 10
    arrays = read_frame(http.get("/api/v1/datasets/with-mock/mock", headers=owner_h).content)[1]
    assert np.array_equal(arrays["n"], mock["n"]) and arrays["n"].dtype == np.int16


def test_resume_after_a_lost_chunk(http: TestClient, owner_h: dict[str, str]) -> None:
    columns = {"x": np.arange(100_000, dtype=np.float64)}
    created = open_session(http, owner_h, "resumed", columns, 10_000, bounds={"x": [0, 1e6]})
    data = stream(columns, 10_000)
    upload_id = created["id"]
    assert put(http, owner_h, upload_id, 0, data[:300_000]).status_code == 200
    # The client lost the answer of the next chunk, and sends it at a stale offset again...
    assert put(http, owner_h, upload_id, 300_000, data[300_000:500_000]).status_code == 200
    stale = put(http, owner_h, upload_id, 300_000, data[300_000:500_000])
    assert stale.status_code == 409
    assert stale.json() == {
        "error": "upload_offset",
        "detail": "this upload session holds 500000 bytes: send the chunk at offset 500000, "
        "not 300000",
        "offset": 500_000,
    }
    # ... or asks where the stream stands, and goes on from there.
    assert http.get(f"{UPLOADS}/{upload_id}", headers=owner_h).json()["received"] == 500_000
    early = http.post(f"{UPLOADS}/{upload_id}/finalize", headers=owner_h)
    assert "holds 500000 of 800000 bytes" in refused(early, 422, "invalid_request")
    send_from = data[500_000:]
    assert put(http, owner_h, upload_id, 500_000, send_from).status_code == 200
    body = http.post(f"{UPLOADS}/{upload_id}/finalize", headers=owner_h).json()
    arrays = read_frame(http.get("/api/v1/datasets/resumed/data", headers=owner_h).content)[1]
    assert body["row_count"] == 100_000 and np.array_equal(arrays["x"], columns["x"])


def test_damaged_and_oversized_chunks_are_refused(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    columns = {"x": np.arange(10, dtype=np.float64)}
    created = open_session(http, owner_h, "damaged", columns, 10, bounds={"x": [0, 10]})
    upload_id, data = created["id"], stream(columns, 10)
    bad = http.put(
        f"{UPLOADS}/{upload_id}",
        params={"offset": 0},
        content=data,
        headers=owner_h | {"X-Content-SHA256": hashlib.sha256(b"other").hexdigest()},
    )
    assert "damaged on the way" in refused(bad, 422, "checksum_mismatch")
    missing = http.put(
        f"{UPLOADS}/{upload_id}", params={"offset": 0}, content=data, headers=owner_h
    )
    assert "X-Content-SHA256" in refused(missing, 422, "invalid_request")
    assert http.get(f"{UPLOADS}/{upload_id}", headers=owner_h).json()["received"] == 0
    past = put(http, owner_h, upload_id, 0, data + b"\x00" * 8)
    assert "runs past the upload's declared size of 80" in refused(past, 413, "payload_too_large")


def test_refused_values_are_counted_over_every_block_and_leave_nothing(
    http: TestClient, owner_h: dict[str, str], context: NodeContext
) -> None:
    x = np.full(30_000, 5.0)
    x[[3, 15_000, 29_999]] = [-1.0, 11.0, np.nan]
    columns = {"y": np.zeros(30_000), "x": x}
    created = open_session(http, owner_h, "bad", columns, 5_000, bounds={"x": [0, 10], "y": [0, 1]})
    send(http, owner_h, created["id"], stream(columns, 5_000), 1 << 20)
    response = http.post(f"{UPLOADS}/{created['id']}/finalize", headers=owner_h)
    assert "column 'x' has 1 NaN or infinite values" in refused(response, 422, "upload_rejected")
    assert blob_files(context) == set()  # column y was stored, then released
    gone = http.get(f"{UPLOADS}/{created['id']}", headers=owner_h)
    refused(gone, 404, "not_found")
    x[29_999] = 0.0
    created = open_session(http, owner_h, "bad", columns, 5_000, bounds={"x": [0, 10], "y": [0, 1]})
    send(http, owner_h, created["id"], stream(columns, 5_000), 1 << 20)
    response = http.post(f"{UPLOADS}/{created['id']}/finalize", headers=owner_h)
    assert "column 'x' has 2 values outside its declared bounds [0, 10]" in refused(
        response, 422, "upload_rejected"
    )


def test_sessions_belong_to_their_user_and_expire(
    http: TestClient,
    owner_h: dict[str, str],
    admin_h: dict[str, str],
    ds_h: dict[str, str],
    context: NodeContext,
) -> None:
    columns = {"x": np.arange(10, dtype=np.float64)}
    created = open_session(http, owner_h, "mine", columns, 10, bounds={"x": [0, 10]})
    upload_id = created["id"]
    for headers in (admin_h, {}):
        response = http.get(f"{UPLOADS}/{upload_id}", headers=headers)
        assert response.status_code in (401, 404)
    refused(http.get(f"{UPLOADS}/{upload_id}", headers=admin_h), 404, "not_found")
    refused(http.get(f"{UPLOADS}/..%2F..%2Fetc", headers=owner_h), 404, "not_found")
    body = {"name": "no", "columns": ["x"], "rows": 10, "block_rows": 10, "tensors": []}
    refused(http.post(UPLOADS, json=body, headers=ds_h), 403, "forbidden")
    # An untouched session is removed once its time to live has passed.
    sessions = context.uploads
    assert sessions.sweep(now=time.time() + 60) == 0
    assert sessions.sweep(now=time.time() + context.settings.upload_session_ttl_seconds + 1) == 1
    refused(http.get(f"{UPLOADS}/{upload_id}", headers=owner_h), 404, "not_found")
    # Deleting a session frees its files.
    created = open_session(http, owner_h, "mine", columns, 10, bounds={"x": [0, 10]})
    assert http.delete(f"{UPLOADS}/{created['id']}", headers=owner_h).status_code == 204
    assert not (context.settings.upload_dir / created["id"]).exists()


def test_limits_and_inconsistent_plans(
    http: TestClient, owner_h: dict[str, str], context: NodeContext
) -> None:
    x = {"x": np.arange(10, dtype=np.float64)}

    def plan(**changes: Any) -> Any:
        body = {
            "name": "t",
            "columns": ["x"],
            "rows": 10,
            "block_rows": 10,
            "tensors": tensors(x, "data"),
            "bounds": {"x": [0, 1]},
        } | changes
        # allow_nan: an infinite bound as JSON text (1e999 reads as infinity), not a string
        text = json.dumps(body).replace("Infinity", "1e999")
        return http.post(UPLOADS, content=text, headers=owner_h | JSON)

    huge = plan(rows=10**9, block_rows=10**6)
    assert "over the limit of" in refused(huge, 422, "upload_rejected")
    strings = plan(tensors=[{"name": "data/x", "dtype": "object", "shape": []}])
    assert "int64 category indices" in refused(strings, 422, "upload_rejected")
    tiny = plan(rows=100_000, block_rows=1)
    assert "block_rows" in refused(tiny, 422, "upload_rejected")
    other = plan(tensors=[{"name": "data/y", "dtype": "float64", "shape": []}])
    for bounds in ([5, 1], [0, math.inf], [-math.inf, 1]):  # refused when the session opens
        # (they were refused at finalize, after every chunk had been sent)
        detail = refused(plan(bounds={"x": bounds}), 422, "upload_rejected")
        assert "must be finite with low <= high" in detail
    assert "must be the declared columns" in refused(other, 422, "upload_rejected")
    # every column without a declaration is named when the session opens, before any chunk
    three = {"x": x["x"], "y": x["x"], "z": x["x"]}
    undeclared = plan(columns=list(three), tensors=tensors(three, "data"))
    assert refused(undeclared, 422, "upload_rejected").startswith(
        "columns 'y', 'z' have no declared bounds; pass bounds={'y': (low, high), 'z': (low, high)}"
    )
    for bounds in ([0, "inf"], ["0", 1]):  # a number in a string is no number (read as one)
        detail = refused(plan(bounds={"x": bounds}), 422, "invalid_request")
        assert "Input should be a valid number" in detail
    # the stream is data first: listed mock first, the real values were stored as the mock
    mock_first = plan(mock_rows=10, tensors=tensors(x, "mock") + tensors(x, "data"))
    assert "data tensors first" in refused(mock_first, 422, "upload_rejected")
    limit = context.settings.max_upload_sessions
    for _ in range(limit):
        assert plan().status_code == 201
    assert "upload sessions open" in refused(plan(), 422, "quota_exceeded")
    listed = http.get(UPLOADS, headers=owner_h).json()
    assert len(listed) == limit and all(s["received"] == 0 for s in listed)
    assert http.delete(f"{UPLOADS}/{listed[0]['id']}", headers=owner_h).status_code == 204
    assert plan().status_code == 201  # a place freed
    shutil.rmtree(context.settings.upload_dir)


def test_a_finalize_streams_its_table_without_holding_the_write_lock(
    http: TestClient, owner_h: dict[str, str], context: NodeContext, monkeypatch: Any
) -> None:
    """On SQLite a writing transaction holds the database's write lock, which every publish
    waits for; a finalize streams the whole table (seconds for hundreds of millions of rows)
    before its transaction begins. Another writer commits in the middle of the stream; then a
    refused column leaves no staged file behind."""
    from dpnode.node.services import finalize

    if context.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL has no database-wide write lock")
    writes: list[str] = []
    real = finalize._encoded_chunks

    def meanwhile(*args: Any) -> Iterator[memoryview]:
        chunks = real(*args)
        yield next(chunks)
        writes.append(write_elsewhere(context))
        yield from chunks

    monkeypatch.setattr(finalize, "_encoded_chunks", meanwhile)
    columns = {"x": np.linspace(0, 1, 50_000), "y": np.zeros(50_000)}
    declared = {"bounds": {"x": [0, 1], "y": [0, 1]}}
    created = open_session(http, owner_h, "streamed", columns, 10_000, **declared)
    send(http, owner_h, created["id"], stream(columns, 10_000), 1 << 20)
    response = http.post(f"{UPLOADS}/{created['id']}/finalize", headers=owner_h)
    assert response.status_code == 201, response.text
    assert writes == ["committed", "committed"]

    stored = blob_files(context)
    columns["y"][-1] = 2.0  # past its bound: refused after x was staged
    created = open_session(http, owner_h, "refused", columns, 10_000, **declared)
    send(http, owner_h, created["id"], stream(columns, 10_000), 1 << 20)
    response = http.post(f"{UPLOADS}/{created['id']}/finalize", headers=owner_h)
    refused(response, 422, "upload_rejected")
    root = context.settings.blob_dir
    assert blob_files(context) == stored and not list(root.rglob(".tmp-*"))
