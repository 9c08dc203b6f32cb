"""A mean of a stored column evaluated by blocks in the node, and on a Dask cluster.

    python -m bench.dask_publish [--rows 10000000 100000000] [--repeat 3] [--workers 2]
    python -m bench.publish --dask [ROWS ...]

For each row count, a float64 column is written to a file blob store, and its mean (the
accurate, tracked plan a publish evaluates) is timed, best of ``--repeat`` runs taken in
turns, three ways:

- *hand NumPy*: ``x.mean()`` on the memory-mapped file (the baseline, pairwise summation);
- *blocks, in the node*: ``dpnode.core.engine.run`` on the mapped column, block by block;
- *Dask*: the same plan on a ``LocalCluster`` of ``--workers`` worker processes (one
  thread each), whose tasks read their rows from the same blob folder
  (``dpnode.node.cluster``), the node gathering their block sums.

It prints the times and the ratios Dask / blocks and blocks / NumPy, and checks that the
cluster's result is bitwise the node's. The machine's cores are shared by everyone: the
point is the cluster's overhead and its correctness, not a speed-up. The file is in the page
cache after the first run (so is every worker's view of it); each worker hashes a column
once, in the warm-up run, as a worker process verifies a blob the first time it opens it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import interleaved_best
from dpnode.core.engine import GraphBuilder, plan, run
from dpnode.node.cluster import Cluster, Column, columns_for
from dpnode.node.settings import Settings
from dpnode.node.storage import RECENT_NS, FileBlobStore

CHUNK = 1 << 22  # rows written at a time (32 MiB)


def _write(store: FileBlobStore, rows: int) -> Column:
    rng = np.random.default_rng(0)
    chunks = (
        rng.uniform(0, 1, min(CHUNK, rows - start)).tobytes() for start in range(0, rows, CHUNK)
    )
    return Column(store.put_stream(chunks), "float64", (rows,))


def _row(
    store: FileBlobStore, settings: Settings, cluster: Cluster, threads: int, rows: int, repeat: int
) -> str:
    """One row count: the column written, the three timings, the table's row."""
    column = _write(store, rows)
    # a file written in the last RECENT_NS is hashed again at each open (storage.py): a
    # stored column is older than that
    time.sleep(RECENT_NS / 1e9 + 0.5)
    b = GraphBuilder()
    name = "dataset:1/x"
    planned = plan(b.build([b.op("mean", b.input(name, "float64", (rows,)))]), accurate=True)
    columns = columns_for(settings, planned, {name: column})
    assert columns is not None
    x = store.open_array(column.digest, column.dtype, column.shape)

    def numpy() -> Any:
        return x.mean()

    def blocks() -> Any:
        return run(planned, {name: x}).outputs[0]

    def dask() -> Any:
        runner = cluster.runner(planned, columns, threads)
        return run(planned, {}, runner=runner).outputs[0]

    same = blocks().tobytes() == dask().tobytes()
    t_np, t_blocks, t_dask = (t * 1e3 for t in interleaved_best([numpy, blocks, dask], repeat))
    store.delete(column.digest)
    return (
        f"| {rows:,} | {t_np:.0f} | {t_blocks:.0f} | {t_blocks / t_np:.2f}x | "
        f"{t_dask:.0f} | {t_dask / t_blocks:.2f}x | {'equal' if same else 'DIFFER'} |"
    )


def measure(rows_list: list[int], repeat: int, workers: int) -> None:
    from distributed import LocalCluster

    print(f"## The mean of a stored float64 column: {workers}-worker LocalCluster vs blocks\n")
    print("| rows | hand NumPy ms | blocks ms | blocks / NumPy | Dask ms | Dask / blocks | bits |")
    print("|---|---|---|---|---|---|---|")
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as local,
    ):
        settings = Settings(
            data_dir=Path(tmp), dask_scheduler=local.scheduler_address, dask_min_bytes=0
        )
        store = FileBlobStore(settings.blob_dir)
        cluster = Cluster(settings)
        threads = cluster.check()
        try:
            for rows in rows_list:
                print(_row(store, settings, cluster, threads, rows, repeat), flush=True)
        finally:
            cluster.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000, 100_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    measure(args.rows, args.repeat, args.workers)


if __name__ == "__main__":
    main()
