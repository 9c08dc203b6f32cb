"""Convolution of private images with public weights (dpnode.core.privacy.rules.conv): sound.

Hypothesis draws the geometry (1-d and 2-d, stride, padding, dilation, groups, transposed,
bias), the dtype, the bounds and the subject structure; neighbouring datasets at the bounds
are evaluated as a publish evaluates them and must move every output by no more than the
tracked sensitivity, with no tolerance, through one convolution and through two with an
activation between them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder, Ref
from dpnode.core.privacy import PrivacyTrackingError, track
from tests.privacy.helpers import Column, assert_sound, neighbours


@st.composite
def geometries(draw: st.DrawFn) -> dict[str, object]:
    nsp = draw(st.integers(1, 2))
    g = draw(st.sampled_from([1, 2]))
    cin = g * draw(st.integers(1, 2))
    cout = g * draw(st.integers(1, 2))
    k = tuple(draw(st.integers(1, 3)) for _ in range(nsp))
    transposed = draw(st.booleans())
    size = tuple(draw(st.integers(2 * kk + 1, 2 * kk + 3)) for kk in k)  # room for every geometry
    return {
        "nsp": nsp,
        "g": g,
        "cin": cin,
        "cout": cout,
        "k": k,
        "size": size,
        "stride": tuple(draw(st.integers(1, 2)) for _ in range(nsp)),
        "padding": tuple(draw(st.integers(0, 1)) for _ in range(nsp)),
        "dilation": tuple(draw(st.integers(1, 2)) for _ in range(nsp)),
        "transposed": transposed,
        "bias": draw(st.booleans()),
    }


def _conv(
    b: GraphBuilder, x: Ref, geo: dict[str, object], rng: np.random.Generator, dt: str
) -> Ref:
    g, cin, cout, k = geo["g"], geo["cin"], geo["cout"], geo["k"]
    assert isinstance(g, int) and isinstance(cin, int) and isinstance(cout, int)
    assert isinstance(k, tuple)
    shape = (cin, cout // g, *k) if geo["transposed"] else (cout, cin // g, *k)
    w = b.constant(rng.uniform(-1, 1, shape).astype(dt))
    args = [x, w]
    if geo["bias"]:
        args.append(b.constant(rng.uniform(-1, 1, cout).astype(dt)))
    return b.op(
        "convolution",
        *args,
        stride=geo["stride"],
        padding=geo["padding"],
        dilation=geo["dilation"],
        groups=g,
        transposed=geo["transposed"],
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    geo=geometries(),
    dtype=st.sampled_from(["float32", "float64"]),
    rows=st.integers(2, 4),
    grouped=st.booleans(),
    twice=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_convolution_sensitivity_bounds_every_neighbour(
    geo: dict[str, object], dtype: str, rows: int, grouped: bool, twice: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    size = geo["size"]
    assert isinstance(size, tuple)
    shape = (rows, geo["cin"], *size)
    subjects = np.array([0, 0, 1, 1][:rows]) if grouped else None
    lo = float(np.float32(rng.uniform(-2, 1)))
    col = Column(dtype, shape, lo, lo + float(np.float32(rng.uniform(0, 3))), subjects)
    b = GraphBuilder()
    x = b.input("x", dtype, shape)  # type: ignore[arg-type]
    y = _conv(b, x, geo, rng, dtype)
    if twice:  # an activation, then a convolution back to cin channels
        second = {**geo, "cin": geo["cout"], "cout": geo["cin"], "transposed": False}
        second.update(stride=(1,) * len(size), padding=geo["k"], dilation=(1,) * len(size))
        y = _conv(b, b.op("tanh", y), second, rng, dtype)
    graph = b.build([y, b.op("sum", y)])
    report = track(graph, {"x": col.spec()})
    for _ in range(4):
        assert_sound(graph, report, *neighbours({"x": col}, rng))


def test_one_image_moves_its_own_outputs_by_the_weights_l1() -> None:
    # a 1x1 kernel of weight w on an image in [0, 1]: each output moves by |w| at most,
    # only in the replaced image's row; the other rows do not move at all
    b = GraphBuilder()
    x = b.input("x", "float64", (3, 1, 4, 4))
    w = b.constant(np.full((2, 1, 1, 1), -0.5))
    y = b.op("convolution", x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    (o,) = track(b.build([y]), {"x": Column("float64", (3, 1, 4, 4), 0.0, 1.0).spec()}).outputs
    assert o.l1 == pytest.approx(2 * 16 * 0.5)  # 2 channels x 16 pixels of one image
    assert np.allclose(o.lower, -0.5, rtol=0, atol=1e-12) and np.allclose(o.upper, 0.0, atol=1e-12)


def test_a_private_weight_is_refused() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (2, 1, 4, 4))
    w = b.input("w", "float64", (1, 1, 3, 3))
    y = b.op("convolution", x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    spec = Column("float64", (2, 1, 4, 4), 0.0, 1.0).spec()
    with pytest.raises(PrivacyTrackingError, match="weight must be public"):
        track(b.build([y]), {"x": spec, "w": spec})
