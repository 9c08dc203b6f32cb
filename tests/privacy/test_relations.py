"""Softmax's relations (dpnode/core/privacy/relations.py): bounded where intervals overflow, sound.

Logits of a wide public range used to make ``exp(x - amax(x))`` overflow float32 in the
tracker's interval arithmetic, so a small MLP's ``cross_entropy`` was refused. These tests
build softmax and log_softmax as the SDK records them, check the bounds the relations give,
check that look-alike graphs are not narrowed, and measure neighbouring datasets at the
bounds against the tracked sensitivity with no tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder, Ref
from dpnode.core.privacy import PrivacyTrackingError, track
from tests.privacy.helpers import Column, assert_sound, neighbours

N, K = 5, 10


#: The SDK's ``rules_nn.SOFTMAX_FLOOR`` (this module runs without torch)
SOFTMAX_FLOOR = -512.0


def _logits(b: GraphBuilder, dtype: str, scale: float) -> Ref:
    x = b.input("x", dtype, (N, K))
    return b.op("mul", x, scale)


def _softmax_parts(b: GraphBuilder, x: Ref, dim: int, of: Ref | None = None) -> tuple[Ref, Ref]:
    """x - amax(of, dim) and its exp, as the SDK's ``_softmax_parts`` records them."""
    z = b.op("sub", x, b.op("amax", x if of is None else of, dims=(dim,), keepdim=True))
    return z, b.op("exp", b.op("maximum", z, SOFTMAX_FLOOR))


def _log_softmax(b: GraphBuilder, x: Ref, dim: int = 1, sum_dim: int | None = None) -> Ref:
    z, e = _softmax_parts(b, x, dim)
    s = b.op("sum", e, dims=(dim if sum_dim is None else sum_dim,), keepdim=True)
    return b.op("sub", z, b.op("log", s))


def _softmax(b: GraphBuilder, x: Ref, dim: int = 1) -> Ref:
    _, e = _softmax_parts(b, x, dim)
    return b.op("div", e, b.op("sum", e, dims=(dim,), keepdim=True))


def _cols(dtype: str, bound: float) -> dict[str, Column]:
    return {"x": Column(dtype, (N, K), -bound, bound)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_log_softmax_of_wide_logits_is_bounded(dtype: str) -> None:
    # logits in [-60, 60]: interval arithmetic put x - amax(x) up to 120, exp(120)
    # overflows float32 (and, scaled by 10, float64): the graph was refused as unbounded
    scale = 1.0 if dtype == "float32" else 10.0
    b = GraphBuilder()
    out = _log_softmax(b, _logits(b, dtype, scale))
    (o,) = track(b.build([out]), {"x": _cols(dtype, 60.0)["x"].spec()}).outputs
    assert np.all(o.upper <= 1e-3)  # <= 0, up to the rounding of log(sum) near 0
    assert np.all(o.lower >= -2 * 60 * scale - math.log(K) - 1)
    # one patient moves one row of K values, each within its range
    assert o.l1 <= K * (2 * 60 * scale + math.log(K) + 2)


def test_softmax_of_wide_logits_lies_in_the_unit_interval() -> None:
    b = GraphBuilder()
    out = _softmax(b, _logits(b, "float32", 1.0))
    (o,) = track(b.build([out]), {"x": _cols("float32", 60.0)["x"].spec()}).outputs
    assert np.all(o.lower >= 0.0) and np.all(o.upper <= 1.0 + 1e-4)
    assert o.l1 <= K * (1.0 + 1e-4)  # one row of K values, each within [0, 1]


def test_the_max_of_another_tensor_is_not_trusted() -> None:
    # x - amax(y): positive when y's max is below x's values, and it overflows as before
    b = GraphBuilder()
    x = _logits(b, "float32", 1.0)
    y = b.op("mul", x, -1.0)
    z, e = _softmax_parts(b, x, 1, of=y)
    specs = {"x": _cols("float32", 60.0)["x"].spec()}
    (zo,) = track(b.build([z]), specs).outputs
    assert np.all(zo.upper >= 119.0)
    with pytest.raises(PrivacyTrackingError, match="unbounded"):
        track(b.build([b.op("sum", e, dims=(1,), keepdim=True)]), specs)


def test_a_sum_over_other_dims_is_not_narrowed() -> None:
    # exp(x - amax(x, dim 1)) summed over dim 0: no element need be 1, the sum may be ~0
    b = GraphBuilder()
    _, e = _softmax_parts(b, _logits(b, "float64", 1.0), 1)
    out = b.op("sum", e, dims=(0,), keepdim=True)
    (o,) = track(b.build([out]), {"x": _cols("float64", 60.0)["x"].spec()}).outputs
    assert np.all(o.lower < 1e-40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(["float32", "float64"]),
    bound=st.sampled_from([0.5, 3.0, 40.0]),
    dim=st.integers(0, 1),
    log=st.booleans(),
    subjects=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_softmax_sensitivity_bounds_every_neighbour(
    dtype: str, bound: float, dim: int, log: bool, subjects: bool, seed: int
) -> None:
    subj = np.array([0, 0, 1, 2, 2]) if subjects else None
    cols = {"x": Column(dtype, (N, K), -bound, bound, subj)}
    b = GraphBuilder()
    x = b.input("x", dtype, (N, K))
    out = _log_softmax(b, x, dim) if log else _softmax(b, x, dim)
    graph = b.build([out, b.op("sum", out, dims=(0,))])
    report = track(graph, {"x": cols["x"].spec()})
    rng = np.random.default_rng(seed)
    for _ in range(4):
        d1, d2 = neighbours(cols, rng)
        assert_sound(graph, report, d1, d2)


def _max_gradient(b: GraphBuilder, x: Ref, of: Ref, n: int, d: int) -> Ref:
    """What a max's backward records: a share 1 / count for each element equal to the max."""
    m = b.op("reshape", b.op("amax", of, dims=(1,), keepdim=False), shape=(n, 1, d))
    hit = b.op("eq", m, x)
    count = b.op("sum", hit, dims=(1,), keepdim=True, dtype="int64")
    share = b.op("div", b.constant(np.ones((n, 1, d), dtype=np.float32)), count)
    return b.op("mul", share, hit)


def test_a_max_s_gradient_is_bounded_and_its_look_alike_is_not() -> None:
    # sum(x == amax(x)) >= 1, so 1 / count is at most 1; against another tensor's max the
    # count may be 0 and the share unbounded
    n, k, d = 3, 4, 2
    spec = Column("float32", (n, k, d), 0.0, 1.0).spec()
    b = GraphBuilder()
    x = b.input("x", "float32", (n, k, d))
    (o,) = track(b.build([_max_gradient(b, x, x, n, d)]), {"x": spec}).outputs
    assert np.all(o.lower >= 0.0) and np.all(o.upper <= 1.0 + 1e-6)  # and a division's last bit
    b = GraphBuilder()
    x = b.input("x", "float32", (n, k, d))
    other = b.op("mul", x, 0.5)
    with pytest.raises(PrivacyTrackingError, match="unbounded"):
        track(b.build([_max_gradient(b, x, other, n, d)]), {"x": spec})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ties=st.booleans(), subjects=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_a_max_s_gradient_bounds_every_neighbour(ties: bool, subjects: bool, seed: int) -> None:
    n, k, d = 4, 3, 2
    subj = np.array([0, 0, 1, 2]) if subjects else None
    # integer-valued inputs in [0, 2] make ties common; uniform ones make them rare
    col = Column("int64" if ties else "float32", (n, k, d), 0, 2, subj)
    b = GraphBuilder()
    x = b.input("x", col.dtype, (n, k, d))
    xf = b.op("convert_element_type", x, dtype="float32") if ties else x
    out = _max_gradient(b, xf, xf, n, d)
    graph = b.build([out, b.op("sum", out)])
    report = track(graph, {"x": col.spec()})
    rng = np.random.default_rng(seed)
    for _ in range(4):
        assert_sound(graph, report, *neighbours({"x": col}, rng))
