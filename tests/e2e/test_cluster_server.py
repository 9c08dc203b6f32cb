"""A real ``dpnode serve`` with ``DPNODE_DASK_SCHEDULER``: an SDK publish evaluated by the
cluster's worker processes; the cluster gone, a clear error and a node that keeps serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpnode import sdk
from tests.e2e.conftest import Server
from tests.node.conftest import require_distributed

ROWS = 100_000


def _dpnode_tasks(dask_scheduler: Any) -> int:
    """Tasks of the node's passes the scheduler has seen (run on the scheduler)."""
    return sum(
        sum(prefix.state_counts.values())
        for name, prefix in dask_scheduler.task_prefixes.items()
        if name.startswith("dpnode")
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_sdk_publish_on_the_cluster_then_the_cluster_gone(
    tmp_path: Path, database_url: str
) -> None:
    distributed = require_distributed()
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        node = Server(tmp_path / "data", database_url)
        node.env |= {
            "DPNODE_DASK_SCHEDULER": cluster.scheduler_address,
            "DPNODE_DASK_MIN_BYTES": "0",
            "DPNODE_DASK_CONNECT_TIMEOUT_SECONDS": "2",
            "DPNODE_DASK_RETRY_AFTER_SECONDS": "7",
        }
        node.start()
        try:
            node.add_users(
                ("o@example.org", "data_owner", "owner password"),
                ("s@example.org", "data_scientist", "scientist password"),
            )
            owner = sdk.login(node.url, email="o@example.org", password="owner password")
            x = np.random.default_rng(2).uniform(0, 1, ROWS)
            owner.upload_dataset("big", {"x": x}, bounds={"x": (0, 1)}, tags=["cluster"])
            ds = sdk.login(node.url, email="s@example.org", password="scientist password")
            column = ds.search(tags=["cluster"])[0]["x"]
            with distributed.Client(cluster.scheduler_address, set_as_default=False) as watch:
                before = watch.run_on_scheduler(_dpnode_tasks)
                value = float(column.mean().publish(epsilon=1.0))
                assert watch.run_on_scheduler(_dpnode_tasks) > before  # the workers ran it
            assert abs(value - x.mean()) < 1e-3
            spent = ds.budget()
        except BaseException:
            node.stop()
            raise
    try:
        with pytest.raises(sdk.EvaluationUnavailableError) as caught:
            column.mean().publish(epsilon=1.0)
        assert caught.value.retry_after == 7
        assert "nothing was charged" in str(caught.value)
        assert ds.budget() == spent  # nothing charged, and the node answers
    finally:
        node.stop()
