"""Batched matmul of per-example operands (dpnode/core/privacy/rules/linalg.py, ``_batched_rows``).

``a[n] @ b[n]`` where row ``n`` of both operands belongs to one subject: what a
convolution's per-example weight gradients record. Neighbours at the bounds must stay within
the tracked sensitivity, with no tolerance; rows of different subjects are refused.
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
    dtype=st.sampled_from(["float32", "float64"]),
    rows=st.integers(1, 4),
    dims=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3)),
    grouped=st.booleans(),
    public_right=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_batched_rows_sensitivity_bounds_every_neighbour(
    dtype: str,
    rows: int,
    dims: tuple[int, int, int, int],
    grouped: bool,
    public_right: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    g, m, k, n = dims
    subjects = np.sort(rng.integers(0, 2, rows)) if grouped else None
    lo = float(np.float32(rng.uniform(-2, 1)))
    cols = {"a": Column(dtype, (rows, g, m, k), lo, lo + 2.0, subjects)}
    b = GraphBuilder()
    a = b.input("a", dtype, (rows, g, m, k))
    if public_right:  # a public right operand, batched alike
        right = b.constant(rng.uniform(-1, 1, (rows, g, k, n)).astype(dtype))
    else:
        cols["b"] = Column(dtype, (rows, g, k, n), -1.0, 0.5, subjects)
        right = b.input("b", dtype, (rows, g, k, n))
    out = b.op("matmul", a, right)
    graph = b.build([out, b.op("sum", out, dims=(0,))])
    report = track(graph, {name: col.spec() for name, col in cols.items()})
    for _ in range(4):
        assert_sound(graph, report, *neighbours(cols, rng))


def test_rows_of_different_subjects_are_refused() -> None:
    b = GraphBuilder()
    a = b.input("a", "float64", (3, 2, 2))
    c = b.op("flip", b.input("b", "float64", (3, 2, 2)), dims=(0,))  # row n meets row 2 - n
    specs = {
        "a": Column("float64", (3, 2, 2), 0.0, 1.0).spec(),
        "b": Column("float64", (3, 2, 2), 0.0, 1.0).spec(),
    }
    with pytest.raises(PrivacyTrackingError, match="different subjects"):
        track(b.build([b.op("matmul", a, c)]), specs)
