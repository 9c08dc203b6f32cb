"""publish on synthetic datasets: exact, free, computed here on the table you may download.

A synthetic dataset (``ds.synthesize(...)``) is already a differentially private release,
paid for once; whatever is computed from it is post-processing. So when every dataset a
publish reads is a synthetic one that this session may download (the data scientist who
made it, its source's owner, an admin), the SDK downloads the table once, evaluates the
graph with the node's own engine here, and returns the exact values: no noise, no charge,
nothing sent but the download. The same code then runs on the real dataset with a
handle swapped, and is charged there. A graph that reads any other dataset (or a model),
or a synthetic table this session may not download, goes to the node as before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core import errors as node_errors
from dpnode.core.engine import Graph, plan
from dpnode.core.engine.evaluator import run
from dpnode.core.inputs import INPUT
from dpnode.sdk._exceptions import (
    DPNodeError,
    InvalidRequestError,
    PermissionDeniedError,
    error_for,
)

__all__ = ["remember", "synthetic_release", "synthetic_tables"]

Table = dict[str, npt.NDArray[Any]]


def _known(client: Any) -> dict[int, Table | None]:
    """The session's verdicts by dataset id: its synthetic table, or None (a synthetic table
    never changes, and an id is never reused)."""
    known: dict[int, Table | None] = client.__dict__.setdefault("_synthetic_tables", {})
    return known


def remember(ds: Any) -> None:
    """What a dataset handle already says: a dataset that is not synthetic is never
    computed here, so its first publish need not ask the node again."""
    if ds.synthetic is None and ds._client is not None:
        _known(ds._client).setdefault(ds.id, None)


def _table(client: Any, dataset_id: int) -> Table | None:
    """Dataset ``dataset_id``'s synthetic table, or None when it is not synthetic or not
    downloadable by ``client``; asked of the node at most once per session."""
    known = _known(client)
    if dataset_id not in known:
        handle = client.dataset(dataset_id)
        table: Table | None = None
        if handle.synthetic is not None:
            try:
                table = dict(handle.download())
            except PermissionDeniedError:  # someone else's synthetic copy: the node decides
                table = None
        known[dataset_id] = table
    return known[dataset_id]


def synthetic_tables(client: Any, names: list[str]) -> dict[int, Table] | None:
    """The synthetic tables behind every input of a graph (its input ``names``), or None
    when any input is not a column of a synthetic dataset this session may download."""
    ids: set[int] = set()
    for name in names:
        match = INPUT.fullmatch(name)
        if match is None or match.group(1) != "dataset":
            return None
        ids.add(int(match.group(2)))
    if not ids or client is None or not hasattr(client, "dataset"):
        return None
    tables: dict[int, Table] = {}
    for dataset_id in sorted(ids):
        table = _table(client, dataset_id)
        if table is None:
            return None
        tables[dataset_id] = table
    return tables


def synthetic_release(
    client: Any, graph: Graph, *, epsilon: float, delta: float | None
) -> tuple[list[npt.NDArray[np.float64]], dict[str, Any]] | None:
    """The exact outputs and a receipt (as the node would send one, charging nothing) of
    publishing ``graph`` when its inputs are all synthetic tables this session may
    download; None otherwise (publish on the node)."""
    names = graph.input_names()
    tables = synthetic_tables(client, names)
    if tables is None:
        return None
    # asked as of any publish, though nothing is spent: the same code is then run on the
    # real dataset with these terms
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidRequestError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if delta is not None and not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise InvalidRequestError(f"delta must be in (0, 1) or None, got {delta!r}")
    values: dict[str, npt.NDArray[Any]] = {}
    for name in names:
        match = INPUT.fullmatch(name)
        assert match is not None
        table, part = tables[int(match.group(2))], match.group(3)
        rows = len(next(iter(table.values()))) if table else 0
        # a synthetic table's rows stand for a subject each
        values[name] = np.arange(rows, dtype=np.int64) if part == "@subject" else table[part]
    try:
        outputs = run(plan(graph, accurate=True), values).outputs
    except node_errors.DPNodeError as exc:  # the node's own checks, raised as the SDK's
        raise error_for(400, exc.code, exc.detail) from None
    except (ArithmeticError, ValueError) as exc:
        raise DPNodeError(f"the computation failed on the synthetic table: {exc}") from None
    sources = ", ".join(f"dataset {i}" for i in sorted(tables))
    receipt = {
        "ledger_id": None,
        "mechanism": "exact",
        "epsilon": 0.0,
        "delta": None,
        "asked_epsilon": epsilon,
        "asked_delta": delta,
        "rho": 0.0,
        "sensitivity_l1": 0.0,
        "sensitivity_l2": 0.0,
        "noise_scale": 0.0,
        "remaining_epsilon": math.nan,
        "post_processing": (
            f"computed exactly here on the synthetic table ({sources}), downloaded: a "
            "release already paid for, so nothing was noised or charged"
        ),
    }
    return [np.asarray(v, dtype=np.float64) for v in outputs], receipt
