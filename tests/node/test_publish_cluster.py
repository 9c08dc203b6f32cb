"""Publishes through the real app with a Dask cluster configured (``DPNODE_DASK_SCHEDULER``).

The workers (two processes of the module's ``LocalCluster``) read the column from the
file store's folder; the node process never opens it. An unreachable cluster is refused
before the charge; a failure after the charge is answered as any failed evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.cluster import Cluster
from dpnode.node.context import NodeContext
from dpnode.node.db.models import AuditEvent, LedgerEntry, User
from dpnode.node.settings import Settings
from tests.node.conftest import publish, refused, require_distributed, upload_ok
from tests.node.frames import read_frame
from tests.node.test_publish_blocks import ROWS, _store_dataset

require_distributed()


@pytest.fixture
def settings(settings: Settings, dask_scheduler: str) -> Settings:
    """The suite's settings, with the module's cluster and a 1 MiB threshold."""
    return settings.model_copy(update={"dask_scheduler": dask_scheduler, "dask_min_bytes": 1 << 20})


@pytest.fixture
def column(context: NodeContext, owner: User) -> tuple[int, np.ndarray[Any, Any]]:
    x = np.random.default_rng(5).uniform(0, 1, ROWS).astype(np.float32)
    return _store_dataset(context, owner, x), x


@pytest.fixture
def opened(context: NodeContext) -> Iterator[list[str]]:
    """The digests the node process's own store opens as arrays (a wrapper that records
    each call and makes it: the node's reads, whatever reads them)."""
    seen: list[str] = []
    store: Any = context.store
    real = store.open_array

    def recording(digest: str, dtype: str, shape: tuple[int, ...]) -> Any:
        seen.append(digest)
        return real(digest, dtype, shape)

    store.open_array = recording
    yield seen
    store.open_array = real


def _mean(dataset_id: int) -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/x", "float32", (ROWS,))
    return encode(b.build([b.op("mean", b.op("mul", x, 2.0))]))


def _value(response: Any) -> tuple[float, dict[str, Any]]:
    assert response.status_code == 200, response.text
    manifest, values = read_frame(response.content)
    (value,) = values.values()
    return float(value), manifest["receipt"]


def _failures(context: NodeContext) -> list[AuditEvent]:
    with context.sessions() as session:
        query = select(AuditEvent).where(AuditEvent.action == "publish.evaluation_failed")
        return list(session.scalars(query))


def _charges(context: NodeContext) -> int:
    with context.sessions() as session:
        return len(session.scalars(select(LedgerEntry.id)).all())


def test_a_publish_on_the_cluster_never_opens_the_column_in_the_node(
    http: TestClient,
    context: NodeContext,
    ds_h: dict[str, str],
    column: tuple[int, np.ndarray[Any, Any]],
    opened: list[str],
) -> None:
    dataset_id, x = column
    with context.sessions() as session:
        from dpnode.node.db.models import Dataset

        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        digest = dataset.columns[0].blob
    frame = _mean(dataset_id)
    there, receipt = _value(publish(http, ds_h, frame, epsilon=1.0))
    assert digest not in opened  # the workers read it
    assert abs(there - 2 * x.mean(dtype=np.float64)) < 1e-4  # Laplace of scale 2 / ROWS
    assert _failures(context) == []

    # the same publish evaluated in the node: the same charge, the column opened here
    cluster, context.cluster = context.cluster, None
    try:
        here, local = _value(publish(http, ds_h, frame, epsilon=1.0))
    finally:
        context.cluster = cluster
    assert digest in opened
    assert abs(here - there) < 1e-4
    changing = {"ledger_id", "spent_epsilon", "spent_delta", "remaining_epsilon", "remaining_delta"}
    assert {k: v for k, v in receipt.items() if k not in changing} == {
        k: v for k, v in local.items() if k not in changing
    }
    assert receipt["epsilon"] == local["epsilon"] == 1.0
    assert receipt["remaining_epsilon"] - local["remaining_epsilon"] == pytest.approx(1.0)


def _small(http: TestClient, owner_h: dict[str, str], small_dataset: dict[str, Any]) -> bytes:
    """A publish under the threshold: evaluated in the node, whatever the cluster's state."""
    body = upload_ok(http, owner_h, "small", small_dataset["data"], bounds=small_dataset["bounds"])
    b = GraphBuilder()
    age = b.input(f"dataset:{body['id']}/age", "int64", (4,))
    return encode(b.build([b.op("sum", age)]))


def test_an_unreachable_cluster_is_refused_before_the_charge(
    http: TestClient,
    context: NodeContext,
    owner_h: dict[str, str],
    ds_h: dict[str, str],
    column: tuple[int, np.ndarray[Any, Any]],
    small_dataset: dict[str, Any],
) -> None:
    distributed = require_distributed()
    small = _small(http, owner_h, small_dataset)
    frame = _mean(column[0])
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as own:
        settings = context.settings.model_copy(
            update={"dask_scheduler": own.scheduler_address, "dask_connect_timeout_seconds": 2}
        )
        context.cluster = Cluster(settings)
        _value(publish(http, ds_h, frame, epsilon=0.5))  # connected, evaluated there
        own.scale(0)  # every worker gone
        deadline = time.monotonic() + 60  # generous: a loaded machine retires them slowly
        while own.scheduler.workers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not own.scheduler.workers
        charged = _charges(context)
        response = publish(http, ds_h, frame, epsilon=0.5)
        detail = refused(response, 503, "evaluation_unavailable")
        assert "no worker" in detail and "nothing was charged" in detail
        assert response.headers["Retry-After"] == str(settings.dask_retry_after_seconds)
    # the scheduler gone too: the client kept from before reconnects, in vain
    response = publish(http, ds_h, frame, epsilon=0.5)
    assert "cannot be reached" in refused(response, 503, "evaluation_unavailable")
    assert _charges(context) == charged
    _value(publish(http, ds_h, small, epsilon=0.5))  # the node keeps serving
    assert _charges(context) == charged + 1
    context.cluster.close()


def test_a_failure_after_the_charge_is_answered_as_any_failed_evaluation(
    http: TestClient,
    context: NodeContext,
    owner_h: dict[str, str],
    ds_h: dict[str, str],
    column: tuple[int, np.ndarray[Any, Any]],
    small_dataset: dict[str, Any],
) -> None:
    assert context.cluster is not None
    small = _small(http, owner_h, small_dataset)
    timed_out = context.settings.model_copy(update={"dask_timeout_seconds": 1e-6})
    context.cluster, cluster = Cluster(timed_out), context.cluster
    try:
        charged = _charges(context)
        value, receipt = _value(publish(http, ds_h, _mean(column[0]), epsilon=1.0))
    finally:
        context.cluster.close()
        context.cluster = cluster
    assert _charges(context) == charged + 1 and receipt["epsilon"] == 1.0
    # the public stand-in (0, within the bounds [0, 2]) noised, as for any failure
    assert abs(value) < 1e-4
    (failure,) = _failures(context)
    assert "TimeoutError" in str(failure.detail)
    _value(publish(http, ds_h, small, epsilon=0.5))  # the node keeps serving
