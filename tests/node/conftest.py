"""Fixtures for the node's HTTP tests: logged-in clients of each role, upload helpers."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from httpx import Response
from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.settings import Settings, get_settings
from tests.conftest import login
from tests.node.frames import dataset_frame, model_frame
from tests.postgres import find_bin_dir

FRAME = {"Content-Type": "application/vnd.dpnode.tensors"}


@pytest.fixture
def admin_h(http: TestClient, admin: User) -> dict[str, str]:
    """Authorization headers of a logged-in admin."""
    return login(http, admin.email)


@pytest.fixture
def owner_h(http: TestClient, owner: User) -> dict[str, str]:
    """Authorization headers of a logged-in data owner."""
    return login(http, owner.email)


@pytest.fixture
def ds_h(http: TestClient, scientist: User) -> dict[str, str]:
    """Authorization headers of a logged-in data scientist."""
    return login(http, scientist.email)


def post_frame(http: TestClient, path: str, headers: dict[str, str], frame: bytes) -> Response:
    return http.post(path, content=frame, headers=headers | FRAME)


def publish(
    http: TestClient, headers: dict[str, str], frame: bytes, epsilon: float, **params: Any
) -> Response:
    """POST a graph frame to ``/api/v1/publish`` at ``epsilon`` (and ``delta=``, ...)."""
    return http.post(
        "/api/v1/publish",
        params={"epsilon": epsilon, **params},
        content=frame,
        headers=headers | {"Content-Type": "application/octet-stream"},
    )


def upload(
    http: TestClient, headers: dict[str, str], name: str, data: dict[str, Any], **manifest: Any
) -> Response:
    """POST a dataset frame built from ``data`` and manifest keywords."""
    return post_frame(http, "/api/v1/datasets", headers, dataset_frame(name, data, **manifest))


def upload_ok(
    http: TestClient, headers: dict[str, str], name: str, data: dict[str, Any], **manifest: Any
) -> dict[str, Any]:
    response = upload(http, headers, name, data, **manifest)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def upload_model(
    http: TestClient, headers: dict[str, str], name: str, weights: dict[str, Any], **manifest: Any
) -> Response:
    return post_frame(http, "/api/v1/models", headers, model_frame(name, weights, **manifest))


def refused(response: Response, status: int, code: str) -> str:
    """Assert the error shape and return the message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] == code, body
    assert isinstance(body["detail"], str) and body["detail"]
    detail: str = body["detail"]
    return detail


def write_elsewhere(context: NodeContext) -> str:
    """Take SQLite's write lock from another connection, waiting at most 0.2 s, and commit:
    ``"committed"``, or SQLite's refusal (``"database is locked"``) while the node holds it."""
    database = context.engine.url.database
    assert database is not None
    other = sqlite3.connect(database, timeout=0.2, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("COMMIT")
        return "committed"
    except sqlite3.OperationalError as exc:
        return str(exc)
    finally:
        other.close()


def blob_files(context: NodeContext) -> set[Path]:
    """Every blob file on disk (temporary files excluded)."""
    root = context.settings.blob_dir
    if not root.exists():
        return set()
    return {p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")}


@pytest.fixture
def small_dataset() -> dict[str, Any]:
    """A small mixed table and its declarations, reusable across tests."""
    return {
        "data": {
            "age": np.array([23, 45, 67, 31], dtype=np.int64),
            "bmi": np.array([21.5, 30.25, 27.0, 19.75]),
        },
        "bounds": {"age": (0, 120), "bmi": (10, 70)},
    }


def require_distributed() -> Any:
    """``distributed`` (the ``dask`` extra): a skip without it, a failure in CI."""
    try:
        import distributed
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("dask[distributed] is required in CI (the dev extra installs it)")
        pytest.skip("dask[distributed] not installed (pip install 'dpnode[dask]')")
    return distributed


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[Any]:
    """A Dask cluster of two worker processes, one thread each, for a test module."""
    distributed = require_distributed()
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dask_scheduler(dask_cluster: Any) -> str:
    """The address of that cluster's scheduler."""
    return str(dask_cluster.scheduler_address)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[list[str]]:
    """The CLI's environment naming the ``settings`` node; yields the ``--pg-bin`` option."""
    monkeypatch.setenv("DPNODE_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("DPNODE_DATABASE_URL", settings.resolved_database_url)
    get_settings.cache_clear()
    pg = settings.resolved_database_url.startswith("postgresql")
    yield ["--pg-bin", str(find_bin_dir())] if pg else []
    get_settings.cache_clear()
