"""Big data in: chunked uploads from the SDK, Arrow sources (Polars, pyarrow, files), resume."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

import dpnode.sdk._client_uploads as sdk_uploads
from dpnode import sdk
from dpnode.node.db.models import User
from tests.conftest import PASSWORD
from tests.sdk.conftest import URL

BOUNDS = {"age": (0, 120), "income": (0, 1e6), "score": (0, 1)}
CATEGORIES = {"sex": ["f", "m", "x"]}


def frame(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "age": rng.integers(18, 90, rows),
            "income": rng.uniform(0, 2e5, rows),
            "score": rng.random(rows).astype(np.float32),
            "sex": rng.choice(["f", "m", "x"], rows),
            "pid": [f"p{i}" for i in rng.integers(0, rows // 2 + 1, rows)],
        }
    )


def upload(client: sdk.Client, name: str, data: Any, **kwargs: Any) -> sdk.DatasetHandle:
    return client.upload_dataset(
        name, data, bounds=BOUNDS, categories=CATEGORIES, subject_id="pid", **kwargs
    )


def same_dataset(a: sdk.DatasetHandle, b: sdk.DatasetHandle) -> None:
    assert [(c.name, c.dtype, c.bounds) for c in a.columns.values()] == [
        (c.name, c.dtype, c.bounds) for c in b.columns.values()
    ]
    assert (a.row_count, a.subject_count) == (b.row_count, b.subject_count)
    x, y = a.download(), b.download()
    assert sorted(x) == sorted(y)
    for name in x:
        assert x[name].dtype == y[name].dtype and np.array_equal(x[name], y[name]), name


def test_chunked_uploads_store_what_one_request_stores(owner_client: sdk.Client) -> None:
    data = frame(5_000)
    whole = upload(owner_client, "whole", data, chunked=False)
    chunked = upload(owner_client, "chunked", data, chunked=True, chunk_bytes=10_000)
    same_dataset(whole, chunked)
    assert [c.dtype for c in chunked.columns.values()] == ["int64", "float64", "float32", "int64"]


def test_arrow_tables_readers_and_files(owner_client: sdk.Client, tmp_path: Path) -> None:
    data = frame(3_000, seed=1)
    whole = upload(owner_client, "reference", data, chunked=False)
    table = pa.Table.from_pandas(data, preserve_index=False)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    with ipc.new_file(tmp_path / "t.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=900)
    pacsv.write_csv(table, tmp_path / "t.csv")
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=500))
    sources: dict[str, Any] = {
        "table": table,
        "reader": reader,
        "parquet": tmp_path / "t.parquet",
        "arrow": str(tmp_path / "t.arrow"),
        "dictionary": table.set_column(3, "sex", pa.compute.dictionary_encode(table.column("sex"))),
    }
    for name, source in sources.items():
        same_dataset(whole, upload(owner_client, name, source, chunk_bytes=50_000))
    # CSV has no float32: the column comes back as float64, with the same values.
    from_csv = upload(owner_client, "csv", tmp_path / "t.csv").download()
    assert from_csv["score"].dtype == np.float64
    expected = whole.download()
    assert np.array_equal(from_csv["score"].astype(np.float32), expected["score"])
    for name in ("age", "income", "sex"):
        assert np.array_equal(from_csv[name], expected[name]), name


def test_polars_frames_keep_their_names_and_dtypes(owner_client: sdk.Client) -> None:
    # Regression: a Polars frame became a 2-D object array, columns x0, x1, ... and numbers
    # strings such as '30.0'.
    data = pl.DataFrame(
        {
            "age": [30, 41, 52, 63],
            "income": [1.5, 2.0, None, 4.0],
            "flag": [True, False, True, True],
            "sex": pl.Series(["f", "m", "x", "f"], dtype=pl.Categorical),
        }
    )
    for chunked in (False, True):
        handle = owner_client.upload_dataset(
            f"polars-{chunked}",
            data,
            bounds={"age": (0, 120), "income": (0, 10)},
            categories=CATEGORIES,
            fill={"income": 0.0},
            chunked=chunked,
        )
        assert [(c.name, c.dtype) for c in handle.columns.values()] == [
            ("age", "int64"),
            ("income", "float64"),
            ("flag", "bool"),
            ("sex", "int64"),
        ]
        values = handle.download()
        assert values["age"].tolist() == [30, 41, 52, 63]
        assert values["income"].tolist() == [1.5, 2.0, 0.0, 4.0]
        assert values["sex"].tolist() == [0, 1, 2, 0]
    lazy = owner_client.upload_dataset(
        "polars-lazy", data.lazy().select("age"), bounds={"age": (0, 120)}
    )
    assert list(lazy.columns) == ["age"] and lazy.row_count == 4


def test_refusals_are_local_and_clear(owner_client: sdk.Client) -> None:
    data = pl.DataFrame({"age": [30, None], "sex": ["f", "q"]})
    # A missing integer travels as a float NaN, refused or filled like any NaN.
    with pytest.raises(sdk.UploadRejectedError, match="'age' has 1 NaN or infinite values"):
        owner_client.upload_dataset("bad", data.select("age"), bounds={"age": (0, 120)})
    filled = owner_client.upload_dataset(
        "filled", data.select("age"), bounds={"age": (0, 120)}, fill={"age": 0}
    )
    assert filled.columns["age"].dtype == "float64"
    assert filled.download()["age"].tolist() == [30.0, 0.0]
    with pytest.raises(sdk.UploadRejectedError, match="not among its declared categories"):
        owner_client.upload_dataset("bad", data.select("sex"), categories=CATEGORIES)
    assert [u for u in owner_client.uploads() if u["dataset_id"] is None] == []  # removed
    with pytest.raises(sdk.UploadRejectedError, match="declare its public category list"):
        owner_client.upload_dataset("bad", data.select("sex"))
    dates = pa.table({"day": pa.array([0, 1], pa.date32())})
    with pytest.raises(sdk.UploadRejectedError, match="Arrow type date32"):
        owner_client.upload_dataset("bad", dates)
    with pytest.raises(sdk.UploadRejectedError, match="outside its declared bounds"):
        owner_client.upload_dataset(
            "bad", {"age": np.arange(200)}, bounds={"age": (0, 120)}, chunked=True
        )


class DropsConnections(httpx.BaseTransport):
    """The app's transport, dropping chosen chunk requests: some before the node sees them,
    some after it handled them (the answer is lost), and the first finalize's answer."""

    def __init__(self, inner: httpx.BaseTransport, before: set[int], after: set[int]) -> None:
        self.inner = inner
        self.before, self.after = before, after
        self.puts = 0
        self.sent = 0
        self.finalized = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.puts += 1
            if self.puts in self.before:
                raise httpx.ConnectError("connection reset", request=request)
            self.sent += len(request.content)
        response = self.inner.handle_request(request)
        lose = request.method == "PUT" and self.puts in self.after
        if request.url.path.endswith("/finalize"):
            self.finalized += 1
            lose = self.finalized == 1
        if lose:
            response.read()
            raise httpx.ReadTimeout("timed out reading the answer", request=request)
        return response


def test_a_dropped_connection_resumes_where_the_node_stands(
    http: TestClient,
    owner: User,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sdk_uploads, "CHUNKED_ABOVE", 1_000_000)  # big tables go in chunks
    transport = DropsConnections(http._transport, before={2, 5}, after={3, 4})
    client = sdk.login(URL, email=owner.email, password=PASSWORD, transport=transport)
    client.retry_backoff = 0.0
    x = np.arange(200_000, dtype=np.float64)
    handle = client.upload_dataset(
        "resumed", {"x": x}, bounds={"x": (0, 1e6)}, chunk_bytes=200_000, progress=True
    )
    assert np.array_equal(handle.download()["x"], x)
    # Every chunk reached the node once: those lost on the way back were not sent again.
    assert transport.sent == x.nbytes
    assert transport.finalized == 2
    assert "upload" in capsys.readouterr().err  # the progress bar


def test_data_scientists_cannot_open_upload_sessions(ds_client: sdk.Client) -> None:
    with pytest.raises(sdk.PermissionDeniedError):
        ds_client.upload_dataset("no", {"x": np.zeros(3)}, bounds={"x": (0, 1)}, chunked=True)


def test_the_big_tables_example_in_the_docs_runs(
    owner_client: sdk.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text()
    section = doc.split("## Big tables")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"owner": owner_client, "__name__": "docs"}
    for code in blocks:
        exec(compile(code, "docs/datasets.md", "exec"), namespace)  # our own docs
    assert namespace["handle"].row_count == 100_000


class DiesAfter(httpx.BaseTransport):
    """The app's transport, unreachable for good after ``puts`` chunks; counts bytes sent."""

    def __init__(self, inner: httpx.BaseTransport, puts: int | None) -> None:
        self.inner, self.puts, self.sent = inner, puts, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            if self.puts is not None and self.puts <= 0:
                raise httpx.ConnectError("network is unreachable", request=request)
            if self.puts is not None:
                self.puts -= 1
            self.sent += len(request.content)
        return self.inner.handle_request(request)


def test_a_failed_upload_resumes_from_another_client(http: TestClient, owner: User) -> None:
    x = np.arange(300_000, dtype=np.float64)
    dying = DiesAfter(http._transport, puts=3)
    first = sdk.login(URL, email=owner.email, password=PASSWORD, transport=dying)
    first.retry_backoff = 0.0
    first.upload_retries = 1
    declared: dict[str, Any] = {"bounds": {"x": (0, 1e6)}, "chunk_bytes": 300_000}
    with pytest.raises(sdk.NodeUnreachableError) as lost:
        first.upload_dataset("later", {"x": x}, chunked=True, **declared)
    upload_id = lost.value.upload_id
    assert upload_id is not None and dying.sent == 900_000
    healthy = DiesAfter(http._transport, puts=None)
    second = sdk.login(URL, email=owner.email, password=PASSWORD, transport=healthy)
    with pytest.raises(sdk.DPNodeError, match="resume with the same data"):
        second.upload_dataset("later", {"x": x[:-1]}, resume=upload_id, **declared)
    handle = second.upload_dataset("later", {"x": x}, resume=upload_id, **declared)
    assert healthy.sent == x.nbytes - 900_000  # only what the node did not hold
    assert np.array_equal(handle.download()["x"], x)


@pytest.mark.parametrize("progress", [True, False])
def test_the_clients_progress_setting_governs_upload_bars(
    http: TestClient, owner: User, capsys: pytest.CaptureFixture[str], progress: bool
) -> None:
    client = sdk.login(
        URL, email=owner.email, password=PASSWORD, transport=http._transport, progress=progress
    )
    x = np.arange(50_000, dtype=np.float64)
    client.upload_dataset("barred", {"x": x}, bounds={"x": (0, 1e6)}, chunked=True)
    assert ("upload" in capsys.readouterr().err) is progress
