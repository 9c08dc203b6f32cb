"""``select`` is ``np.where``, bit for bit, for every dtype, shape and aliasing the engine
uses; the ``where`` prim and the DP-SGD clip choose with it (their time: bench/side_channels.py)."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder, evaluate
from dpnode.core.engine.constant_time import select

DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.uint8, np.bool_]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_select_is_where_bit_for_bit(data: st.DataObject, dtype: type) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=5))
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, base_shape=shape))
    cond = data.draw(hnp.arrays(np.bool_, shapes.input_shapes[0]))
    a = data.draw(hnp.arrays(dtype, shapes.input_shapes[1]))
    b = data.draw(hnp.arrays(dtype, shapes.input_shapes[2]))
    expected = np.where(cond, a, b)
    got = select(cond, a, b)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()  # NaN payloads and signed zeros included


def test_select_may_write_over_either_argument() -> None:
    cond = np.array([True, False, True, False])
    a = np.array([1.0, -0.0, np.nan, 4.0])
    b = np.array([-1.0, 0.0, 3.0, -np.inf])
    want = np.where(cond, a, b)
    for target in ("a", "b"):
        aa, bb = a.copy(), b.copy()
        out = aa if target == "a" else bb
        assert select(cond, aa, bb, out=out) is out
        assert out.tobytes() == want.tobytes()
    with pytest.raises(ValueError, match="out is"):
        select(cond, a, b, out=np.empty(3))


def test_select_takes_scalars_and_narrow_floats() -> None:
    cond = np.array([[True], [False]])
    got = select(cond, np.arange(3, dtype=np.float32), 7.5, np.float32)
    assert got.tolist() == [[0.0, 1.0, 2.0], [7.5, 7.5, 7.5]] and got.dtype == np.float32
    bf = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    got = select(np.array([False, True]), bf, 0.0, ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16 and got.astype(np.float32).tolist() == [0.0, -2.0]


def test_the_where_prim_and_the_clip_choose_as_before() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 4))
    b = GraphBuilder()
    xi = b.input("x", "float64", (50, 4))
    gi = b.input("g", "int64", (50,))
    chosen = b.op("where", b.op("gt", xi, 0.2), xi, -0.0)
    clipped = b.op("clip_by_subject_norm", xi, gi, max_norm=1.0)
    graph = b.build([chosen, clipped])
    got_where, got_clip = evaluate(graph, {"x": x, "g": np.arange(50)})
    assert got_where.tobytes() == np.where(x > 0.2, x, -0.0).tobytes()
    norms = np.sqrt((x * x).sum(axis=1))
    want = np.where(norms > 1.0, 1.0 / norms, 1.0) @ x
    np.testing.assert_allclose(got_clip, want, rtol=1e-12)
