"""Block passes on a Dask cluster: bitwise the node's own block evaluation, columns read there.

One ``LocalCluster`` of two worker processes (one thread each) serves the module (see
tests/node/dask_cluster.py). The workers open the stored columns themselves, from the file
store's folder or from the S3 bucket (s3rver, as in tests/node/test_storage_s3.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpnode.core.engine import plan, run
from dpnode.node.cluster import Cluster, Column, columns_for
from dpnode.node.settings import Settings
from dpnode.node.storage import BlobStore, FileBlobStore, array_to_bytes
from dpnode.sdk._remote import graph_for, remote_input
from tests.node.conftest import require_distributed
from tests.node.test_storage_s3 import KEY, s3_endpoint  # noqa: F401  (a fixture)

require_distributed()

#: 70 blocks of 4096 rows and an odd tail: several ranges per pass, the last one short
N = 70 * 4096 + 2048 + 7
ELEMENTS = 4096  # elements per block here (the node's default is 2^20)

Graphs = Callable[[dict[str, Any]], Any]

GRAPHS: dict[str, Graphs] = {
    "mean of a float column": lambda t: t["x"].mean(),
    "float32 mean": lambda t: t["y"].float().mean(),
    "variance (two passes)": lambda t: t["x"].var(),
    "count above a threshold": lambda t: (t["x"] > 0.25).sum(),
    "integer sum": lambda t: t["i"].sum(),
    "2-d column summed over rows": lambda t: t["X"].sum(0),
    "several outputs": lambda t: [t["y"].std(), (t["X"] * 2).mean(0, keepdim=True)],
    "normal equations": lambda t: [t["X"].T @ t["X"], t["X"].T @ t["x"], t["X"].sum(0)],
}


def _values() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(11)
    return {
        "x": rng.uniform(-1, 1, N),
        "y": rng.uniform(0, 3, N).astype(np.float32),
        "i": rng.integers(-(2**40), 2**40, N),
        "X": rng.uniform(-1, 1, (N, 3)),
    }


def _remote(values: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    dtypes = {"float64": torch.float64, "float32": torch.float32, "int64": torch.int64}
    return {k: remote_input(k, v.shape, dtypes[v.dtype.name]) for k, v in values.items()}


def _stored(store: BlobStore, values: dict[str, np.ndarray[Any, Any]]) -> dict[str, Column]:
    return {
        k: Column(store.put(array_to_bytes(v)), v.dtype.name, tuple(v.shape))
        for k, v in values.items()
    }


def _compare(cluster: Cluster, store: BlobStore, settings: Settings, threads: int) -> None:
    values = _values()
    stored = _stored(store, values)
    for name, build in GRAPHS.items():
        out = build(_remote(values))
        planned = plan(graph_for(out if isinstance(out, list) else [out]), accurate=True)
        columns = columns_for(settings, planned, stored)
        assert columns is not None, name
        inputs = {k: values[k] for k in planned.graph.input_names()}
        here = run(planned, inputs, block_elements=ELEMENTS).outputs
        runner = cluster.runner(planned, columns, threads, ELEMENTS)
        there = run(planned, {}, block_elements=ELEMENTS, runner=runner).outputs
        for h, t in zip(here, there, strict=True):
            assert (h.dtype, h.shape) == (t.dtype, t.shape), name
            assert h.tobytes() == t.tobytes(), (name, h, t)


def test_passes_on_the_cluster_give_the_local_bits_from_a_shared_folder(
    dask_scheduler: str, tmp_path: Path
) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    settings = Settings(data_dir=tmp_path, dask_scheduler=dask_scheduler, dask_min_bytes=0)
    cluster = Cluster(settings)
    try:
        threads = cluster.check()
        assert threads == 2
        _compare(cluster, store, settings, threads)
    finally:
        cluster.close()


def test_passes_on_the_cluster_give_the_local_bits_from_s3(
    dask_scheduler: str,
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path / "node",
        dask_scheduler=dask_scheduler,
        dask_min_bytes=0,
        blob_store="s3",
        s3_endpoint=s3_endpoint,
        s3_bucket="cluster",
        s3_access_key=KEY,
        s3_secret_key=KEY,
        s3_secure=False,
    )
    from dpnode.node.context import make_store

    store = make_store(settings)  # the node's writer: its cache is not the workers'
    cluster = Cluster(settings)
    try:
        _compare(cluster, store, settings, cluster.check())
    finally:
        cluster.close()


def test_what_goes_to_the_cluster_is_decided_from_public_metadata(tmp_path: Path) -> None:
    values = _values()
    stored = {k: Column("0" * 64, v.dtype.name, tuple(v.shape)) for k, v in values.items()}
    on = Settings(data_dir=tmp_path, dask_scheduler="tcp://127.0.0.1:1", dask_min_bytes=0)
    mean = plan(graph_for([_remote(values)["x"].mean()]), accurate=True)
    assert columns_for(on, mean, stored) == {0: stored["x"]}
    # no scheduler; under the threshold; a row input not stored; a graph without blocks
    assert columns_for(Settings(data_dir=tmp_path), mean, stored) is None
    big = on.model_copy(update={"dask_min_bytes": 8 * N + 1})
    assert columns_for(big, mean, stored) is None
    assert columns_for(on, mean, {}) is None
    cumsum = plan(graph_for([_remote(values)["x"].cumsum(0).sum()]), accurate=True)
    assert columns_for(on, cumsum, stored) is None


def test_a_worker_killed_during_a_run_changes_no_bit(dask_scheduler: str, tmp_path: Path) -> None:
    """A worker process SIGKILLed while it runs a task of the pass: Dask runs its tasks
    again on the other worker (and the one its nanny restarts); the sums are the same."""
    from distributed import Client

    rows = 4_000_000
    x = np.random.default_rng(3).uniform(-1, 1, rows)
    store = FileBlobStore(tmp_path / "blobs")
    stored = {"x": Column(store.put(array_to_bytes(x)), "float64", (rows,))}
    settings = Settings(data_dir=tmp_path, dask_scheduler=dask_scheduler, dask_min_bytes=0)
    planned = plan(graph_for([_remote({"x": x})["x"].mean()]), accurate=True)
    columns = columns_for(settings, planned, stored)
    assert columns is not None
    here = run(planned, {"x": x}, block_elements=ELEMENTS).outputs[0]
    cluster = Cluster(settings)
    watcher = Client(dask_scheduler, set_as_default=False)
    try:
        runner = cluster.runner(planned, columns, cluster.check(), ELEMENTS)
        pids: dict[str, int] = watcher.run(os.getpid)
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(run(planned, {}, runner=runner)))
        thread.start()
        killed = None
        deadline = time.monotonic() + 30
        while killed is None and thread.is_alive() and time.monotonic() < deadline:
            busy = [w for w, keys in watcher.processing().items() if keys]
            if busy:
                killed = pids[busy[0]]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.005)
        assert killed is not None, "the run ended before a worker could be killed"
        thread.join(60)
        assert not thread.is_alive()
        assert len(result) == 1
        assert result[0].outputs[0].tobytes() == here.tobytes()
        gone = watcher.run(os.getpid)
        assert killed not in gone.values()
    finally:
        watcher.close()
        cluster.close()
