"""Evaluate large publishes on a Dask cluster: the rows spread over workers, the noise here.

What goes there is decided from public metadata alone (:func:`columns_for`): a plan that
only sums over its rows (``Plan.blocks``, :mod:`dpnode.core.engine.blocks`) whose row inputs
are all stored columns of at least ``dask_min_bytes``. Everything else is evaluated in the
node's process, as without a cluster.

Each pass over the rows becomes one task per range of whole blocks. A task opens the
stored columns on its worker through the blob store's own ``open_array`` (a shared folder:
the file mapped and hashed once per worker process; S3: downloaded once into the worker's
local directory and verified), and runs :func:`~dpnode.core.engine.blocks.pass_sums` on its
rows, the very loop the node runs on its own (same blocks, same code). It returns only the
range's block sums, which the node merges in row order: the result is bitwise the node's
own block evaluation. The node never reads a row input; values between passes (a mean
before a variance's second pass) are computed on the node and sent with the next pass.
The noise is drawn on the node, from its own generator, after the outputs are back; the
privacy tracking ran on the graph before anything was charged, as for any publish.

Failures: before a publish is charged, :meth:`Cluster.check` reaches the scheduler and
counts its workers; unreachable, or no worker, is refused with
:class:`~dpnode.core.errors.EvaluationUnavailableError` (``503``), nothing charged or read.
A worker lost during a run is Dask's to handle (its tasks run again elsewhere). A failure
after the charge (every worker lost, the scheduler gone, the timeout) is answered as any
evaluation that fails after its charge (:mod:`dpnode.node.services.publish`).

Trust: the tasks carry the graph, the store's address (and its credentials, for S3), and
their results are sums of private values. The cluster is the node's own, reached on a
private network (with Dask's TLS settings, ``tls://``): Dask pickles between the node and
its workers; nothing a client sends is ever unpickled.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dpnode.core.engine import Plan
from dpnode.core.engine.blocks import BLOCK_ELEMENTS, PassRunner, RangeSums, Schedule, pass_sums
from dpnode.core.engine.graph import Graph
from dpnode.core.engine.prims.registry import Call
from dpnode.core.engine.subnormals import single_threaded_blas
from dpnode.core.errors import EvaluationUnavailableError
from dpnode.node.settings import Settings
from dpnode.node.storage import BlobStore, FileBlobStore

__all__ = ["Cluster", "Column", "StoreSpec", "columns_for"]

log = logging.getLogger("dpnode")

#: Ranges of rows per pass: at least two per worker thread (a lost worker's share is
#: spread), and at most this many blocks each (a task's result and retry stay small).
MAX_BLOCKS_PER_TASK = 16


@dataclass(frozen=True)
class StoreSpec:
    """How a worker opens the node's blob store: a folder it shares, or the S3 bucket."""

    kind: Literal["file", "s3"]
    #: the file store's folder as the workers see it
    root: str = ""
    endpoint: str = ""
    bucket: str = ""
    prefix: str = ""
    region: str | None = None
    secure: bool = True
    access_key: str = field(default="", repr=False)
    secret_key: str = field(default="", repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> StoreSpec:
        if settings.blob_store == "s3":
            return cls(
                "s3",
                endpoint=settings.s3_endpoint,
                bucket=settings.s3_bucket,
                prefix=settings.s3_prefix,
                region=settings.s3_region,
                secure=settings.s3_secure,
                access_key=settings.s3_access_key,
                secret_key=settings.s3_secret_key.get_secret_value(),
            )
        root = settings.dask_blob_dir or str(settings.blob_dir.resolve())
        return cls("file", root=root)


@dataclass(frozen=True)
class Column:
    """A stored column a task reads: its blob, dtype and shape (public metadata)."""

    digest: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def columns_for(
    settings: Settings, planned: Plan, stored: Mapping[str, Column]
) -> dict[int, Column] | None:
    """The row inputs a cluster would read, by input node, or None: evaluate in the node.

    From public metadata only: a cluster is configured, the plan has blocks, every row
    input is a stored column (``stored``, by input name), and together they hold at least
    ``dask_min_bytes``.
    """
    s = planned.blocks
    if not settings.dask_scheduler or s is None:
        return None
    found: dict[int, Column] = {}
    for i, node in enumerate(planned.graph.nodes):
        if node.op != "input" or not s.row[i]:
            continue
        column = stored.get(str(node.attrs["name"]))
        meta = planned.metas[i]
        if column is None or column.shape != meta.shape or np.dtype(column.dtype) != meta.dtype.np:
            return None  # a public value over the rows, or a mismatch the node reports
        found[i] = column
    if not found or sum(c.nbytes for c in found.values()) < settings.dask_min_bytes:
        return None
    return found


def ranges(s: Schedule, elements: int, threads: int) -> list[tuple[int, int]]:
    """The row ranges of one pass: whole blocks of ``s.block_rows(elements)`` rows.

    >>> ranges(Schedule(10 * 4096, 1, (), (), ()), 4096, 2)
    [(0, 12288), (12288, 24576), (24576, 36864), (36864, 40960)]
    """
    step = s.block_rows(elements)
    blocks = -(-s.rows // step)
    tasks = min(blocks, max(2 * threads, -(-blocks // MAX_BLOCKS_PER_TASK)))
    per = -(-blocks // tasks)
    return [(a, min(a + per * step, s.rows)) for a in range(0, s.rows, per * step)]


# -- on the workers -------------------------------------------------------------------------

_STORES: dict[StoreSpec, BlobStore] = {}
_STORES_LOCK = threading.Lock()


def _worker_store(spec: StoreSpec) -> BlobStore:
    """This worker process's store (kept: a large file is hashed once per process)."""
    with _STORES_LOCK:
        store = _STORES.get(spec)
        if store is None:
            if spec.kind == "s3":
                from distributed import get_worker

                from dpnode.node.storage_s3 import S3BlobStore

                cache = Path(get_worker().local_directory) / "dpnode-blobs"
                store = S3BlobStore.connect(
                    spec.endpoint,
                    spec.bucket,
                    cache,
                    access_key=spec.access_key,
                    secret_key=spec.secret_key,
                    region=spec.region,
                    secure=spec.secure,
                    prefix=spec.prefix,
                )
            else:
                store = FileBlobStore(Path(spec.root))
            _STORES[spec] = store
        return store


def _pass_range(
    spec: StoreSpec,
    columns: Mapping[int, Column],
    s: Schedule,
    graph: Graph,
    calls: Sequence[Call | None],
    p: int,
    values: Mapping[int, Any],
    start: int,
    stop: int,
    elements: int,
) -> dict[int, RangeSums]:
    """One task: pass ``p`` over rows ``start:stop`` of the stored columns, on a worker."""
    single_threaded_blas()  # as on the node (dpnode.core.engine.subnormals)
    store = _worker_store(spec)
    arrays = {i: store.open_array(c.digest, c.dtype, c.shape) for i, c in columns.items()}

    def rows(i: int, a: int, b: int) -> Any:
        return arrays[i][a:b]

    return pass_sums(s, graph, calls, p, values, rows, start, stop, elements)


# -- on the node ----------------------------------------------------------------------------


class Cluster:
    """The node's connection to its Dask scheduler, made on first use and kept."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.address = settings.dask_scheduler
        self.spec = StoreSpec.from_settings(settings)
        #: a ``distributed.Client`` (typed Any: distributed's API is partly untyped)
        self._client: Any = None
        self._lock = threading.Lock()

    def _unavailable(self, why: str) -> EvaluationUnavailableError:
        return EvaluationUnavailableError(
            f"the node's compute cluster is unavailable ({why}): nothing was charged; retry later",
            retry_after=self.settings.dask_retry_after_seconds,
        )

    def _connected(self) -> Any:
        import distributed

        with self._lock:
            client = self._client
            if client is not None and client.status == "running":
                return client
            self._client = None
            if client is not None:
                _close(client)
            try:
                client = distributed.Client(  # type: ignore[no-untyped-call]
                    self.address,
                    timeout=self.settings.dask_connect_timeout_seconds,
                    set_as_default=False,
                )
            except Exception as exc:  # unreachable, refused, a TLS mismatch, a timeout
                log.warning("dask scheduler %s unreachable: %s", self.address, exc)
                raise self._unavailable("its scheduler cannot be reached") from None
            self._client = client
            return client

    def check(self) -> int:
        """The worker threads the cluster has now (at least one), before a publish is charged.

        Raises:
            EvaluationUnavailableError: the scheduler cannot be reached, or has no worker.
        """
        client = self._connected()
        try:
            threads = client.nthreads(callback_timeout=self.settings.dask_connect_timeout_seconds)
        except Exception as exc:
            log.warning("dask scheduler %s did not answer: %s", self.address, exc)
            raise self._unavailable("its scheduler does not answer") from None
        total = sum(threads.values())
        if total < 1:
            raise self._unavailable("it has no worker")
        return int(total)

    def runner(
        self,
        planned: Plan,
        columns: Mapping[int, Column],
        threads: int,
        elements: int = BLOCK_ELEMENTS,
    ) -> PassRunner:
        """What evaluates ``planned``'s passes on the cluster (for ``run_release``)."""
        s = planned.blocks
        assert s is not None
        deadline = time.monotonic() + self.settings.dask_timeout_seconds
        spread = ranges(s, elements, threads)
        run_id = uuid.uuid4().hex

        def run_pass(p: int, values: Mapping[int, Any]) -> list[dict[int, RangeSums]]:
            client = self._connected()
            read = set(s.passes[p].nodes)
            used = {i: c for i, c in columns.items() if i in read}
            args = (self.spec, used, s, planned.graph, planned.calls, p, dict(values))
            futures = [
                client.submit(
                    _pass_range,
                    *args,
                    start,
                    stop,
                    elements,
                    key=f"dpnode-{run_id}-{p}-{k}",
                    pure=False,
                )
                for k, (start, stop) in enumerate(spread)
            ]
            try:
                # in row order; each waits for what is left of the evaluation's time
                return [f.result(timeout=max(deadline - time.monotonic(), 0.001)) for f in futures]
            finally:
                client.cancel(futures)  # done or not, the cluster keeps nothing

        return run_pass

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                _close(self._client)
                self._client = None


def _close(client: Any) -> None:
    try:
        client.close(timeout=2)
    except Exception as exc:  # a client whose scheduler is gone may fail to say goodbye
        log.debug("closing the dask client: %s", exc)
