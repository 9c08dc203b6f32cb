"""A publish over more rows than one block: the column mapped, not read; evaluated in blocks."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode, evaluator
from dpnode.core.engine.blocks import BLOCK_ELEMENTS
from dpnode.node import storage
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import datasets
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.tabular import ColumnSpec
from tests.node.conftest import publish, refused
from tests.node.frames import read_frame

ROWS = BLOCK_ELEMENTS + 3 * 2048 + 5  # two blocks, the second with an odd tail


def _root(array: np.ndarray[Any, Any]) -> object:
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _store_dataset(context: NodeContext, owner: User, x: np.ndarray[Any, Any]) -> int:
    """A dataset written through the service, past the test app's upload caps."""
    upload = DatasetUpload(
        name="big",
        description="",
        tags=[],
        spec=ColumnSpec(bounds={"x": (0.0, 1.0)}, categories={}),
        order=["x"],
        columns={"x": x},
    )
    with context.sessions() as session:
        actor = session.get(User, owner.id)
        assert actor is not None
        dataset = datasets.create_dataset(session, context.store, actor, upload, max_elements=ROWS)
        return dataset.id


def test_a_mean_over_a_mapped_column_is_evaluated_in_blocks(
    http: TestClient,
    context: NodeContext,
    owner: User,
    ds_h: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(storage, "MAP_BYTES", 1 << 20)  # map this 4 MB column, as a big one
    x = np.random.default_rng(7).uniform(0, 1, ROWS).astype(np.float32)
    body = {"id": _store_dataset(context, owner, x)}
    seen: list[object] = []
    blocks = evaluator.run_blocks

    def spy(s: Any, graph: Any, calls: Any, bound: Any, *args: Any) -> Any:
        seen.extend(_root(v) for v in bound.values())
        return blocks(s, graph, calls, bound, *args)

    monkeypatch.setattr(evaluator, "run_blocks", spy)
    b = GraphBuilder()
    xi = b.input(f"dataset:{body['id']}/x", "float32", (ROWS,))
    mean = encode(b.build([b.op("mean", b.op("mul", xi, 2.0))]))
    response = publish(http, ds_h, mean, epsilon=1.0)
    assert response.status_code == 200, response.text
    _, values = read_frame(response.content)
    (value,) = values.values()
    # Laplace noise of scale 1 / ROWS, on a grid of about that size
    assert abs(float(value) - 2 * x.mean(dtype=np.float64)) < 1e-4
    assert len(seen) == 1 and isinstance(seen[0], mmap.mmap)

    # A graph the tracker cannot bound is refused before anything is read or evaluated.
    b = GraphBuilder()
    xi = b.input(f"dataset:{body['id']}/x", "float32", (ROWS,))
    unbounded = encode(b.build([b.op("mean", b.op("log", xi))]))
    detail = refused(publish(http, ds_h, unbounded, epsilon=1.0), 422, "untrackable_graph")
    assert "unbounded" in detail
    assert len(seen) == 1
