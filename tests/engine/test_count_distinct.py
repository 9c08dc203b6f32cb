"""The count_distinct prim against NumPy and pandas: its kernel, shape rule and refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpnode.core.engine import GraphBuilder, evaluate, infer
from dpnode.core.engine.prims.distinct import MAX_GROUPS
from dpnode.core.errors import GraphError

_FLOATS = st.sampled_from([0.0, -0.0, 1.5, -2.0, np.nan, np.inf, -np.inf, 3.0, 60000.0])


def _count(x: np.ndarray, index: np.ndarray | None = None, groups: int = 0) -> Any:
    b = GraphBuilder()
    node = b.input("x", str(x.dtype), x.shape)
    if index is None:
        g = b.build([b.op("count_distinct", node)])
        return evaluate(g, {"x": x})[0]
    i = b.input("i", str(index.dtype), index.shape)
    g = b.build([b.op("count_distinct", node, i, groups=groups)])
    return evaluate(g, {"x": x, "i": index})[0]


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.float64, np.float32, np.float16]),
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
        elements=_FLOATS,
    )
)
def test_floats_count_as_numpy_unique_nan_once(x: np.ndarray) -> None:
    got = _count(x)
    assert got.dtype == np.int64 and got.shape == ()
    assert int(got) == np.unique(x).size
    assert int(got) == pd.Series(x.ravel()).nunique(dropna=False)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.int64, np.int32, np.uint8, np.bool_]),
        hnp.array_shapes(min_dims=1, max_dims=2, max_side=8),
    )
)
def test_integers_and_bools_count_as_numpy_unique(x: np.ndarray) -> None:
    assert int(_count(x)) == np.unique(x).size


def test_bfloat16_counts_its_own_values() -> None:
    x = np.array([1.0, 1.00390625, 1.0078125, 1.0], dtype=np.float32)
    assert int(_count(x.astype("bfloat16"))) == 2  # the middle one rounds to 1.0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_per_group_is_each_groups_own_count(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 30))
    groups = data.draw(st.integers(1, 5))
    x = data.draw(hnp.arrays(np.float64, n, elements=_FLOATS))
    index = data.draw(hnp.arrays(np.int64, n, elements=st.integers(-2, groups + 1)))
    got = _count(x, index, groups)
    assert got.dtype == np.int64 and got.shape == (groups,)
    want = [np.unique(x[index == g]).size for g in range(groups)]
    assert got.tolist() == want


def test_an_empty_group_counts_zero_and_rows_outside_count_nowhere() -> None:
    x = np.array([1.0, 2.0, 2.0, 7.0])
    assert _count(x, np.array([0, 0, 0, -1]), 3).tolist() == [2, 0, 0]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda b, x, i: b.op("count_distinct", x, groups=2), "goes with groups > 0"),
        (lambda b, x, i: b.op("count_distinct", x, i), "goes with groups > 0"),
        (
            lambda b, x, i: b.op("count_distinct", x, i, groups=MAX_GROUPS + 1),
            "groups must be in",
        ),
        (
            lambda b, x, i: b.op("count_distinct", x, b.op("slice", i, dim=0, end=3), groups=2),
            "one per element",
        ),
        (
            lambda b, x, i: b.op("count_distinct", x, b.op("lt", i, 1), groups=2),
            "must be integers",
        ),
    ],
)
def test_a_malformed_count_is_refused_by_name(build: Any, match: str) -> None:
    b = GraphBuilder()
    x, i = b.input("x", "float64", (4,)), b.input("i", "int64", (4,))
    with pytest.raises(GraphError, match=rf"count_distinct.*{match}"):
        infer(b.build([build(b, x, i)]))
