"""A public table read at private positions (dpnode/core/privacy/rules/shape.py, ``_lookup``).

An embedding or a lookup reads a public table at private indices: each output is some entry
of the table, so it lies between the least and the greatest entry along the dim, and moves
anywhere in between with its index. Neighbours at the bounds, with indices that may fall out
of range (a total kernel clamps them), must stay within the tracked sensitivity.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder
from dpnode.core.privacy import PrivacyTrackingError, track
from tests.privacy.helpers import Column, assert_sound, neighbours


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(["index_select", "gather"]),
    rows=st.integers(1, 5),
    size=st.integers(1, 4),
    high=st.integers(0, 6),  # indices up to 6 into a table of `size`: some out of range
    grouped=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_lookup_sensitivity_bounds_every_neighbour(
    op: str, rows: int, size: int, high: int, grouped: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    table = rng.uniform(-3, 3, (size, 3))
    subjects = np.sort(rng.integers(0, 2, rows)) if grouped else None
    b = GraphBuilder()
    if op == "index_select":
        col = Column("int64", (rows,), 0, high, subjects)
        idx = b.input("i", "int64", (rows,))
        out = b.op("index_select", b.constant(table), idx, dim=0)
    else:
        col = Column("int64", (rows, 3), 0, high, subjects)
        idx = b.input("i", "int64", (rows, 3))
        out = b.op("gather", b.constant(table[:1].repeat(rows, 0)), idx, dim=1)
    graph = b.build([out, b.op("sum", out)])
    report = track(graph, {"i": col.spec()})
    for _ in range(4):
        assert_sound(graph, report, *neighbours({"i": col}, rng))


def test_an_embedding_row_moves_within_each_column_s_range() -> None:
    table = np.array([[0.0, 10.0], [1.0, -5.0], [4.0, 0.0]])
    b = GraphBuilder()
    idx = b.input("i", "int64", (5,))
    out = b.op("index_select", b.constant(table), idx, dim=0)
    (o,) = track(b.build([out]), {"i": Column("int64", (5,), 0, 2).spec()}).outputs
    assert np.allclose(o.lower, np.broadcast_to([0.0, -5.0], (5, 2)), rtol=1e-12, atol=0)
    assert np.allclose(o.upper, np.broadcast_to([4.0, 10.0], (5, 2)), rtol=1e-12, atol=0)
    assert o.exact_l1 == 4.0 + 15.0  # one row replaced: each column anywhere in its range


def test_a_private_table_or_multi_index_is_refused() -> None:
    b = GraphBuilder()
    t = b.input("t", "float64", (3, 2))
    idx = b.input("i", "int64", (4,))
    specs = {
        "t": Column("float64", (3, 2), 0.0, 1.0).spec(),
        "i": Column("int64", (4,), 0, 2).spec(),
    }
    with pytest.raises(PrivacyTrackingError, match="index a public table"):
        track(b.build([b.op("index_select", t, idx, dim=0)]), specs)
    with pytest.raises(PrivacyTrackingError, match="index a public table"):
        track(b.build([b.op("index", b.constant(np.ones((3, 2))), idx)]), specs)
