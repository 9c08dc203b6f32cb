"""Softmax's relations (node/privacy/relations.py): bounded where intervals overflow, sound.

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

from node.engine import GraphBuilder, Ref
from node.privacy import PrivacyTrackingError, track
from tests.privacy.helpers import Column, assert_sound, neighbours

N, K = 5, 10


def _logits(b: GraphBuilder, dtype: str, scale: float) -> Ref:
    x = b.input("x", dtype, (N, K))
    return b.op("mul", x, scale)


def _softmax_parts(b: GraphBuilder, x: Ref, dim: int, of: Ref | None = None) -> tuple[Ref, Ref]:
    """x - amax(of, dim) and its exp, as the SDK's ``_softmax_parts`` records them."""
    z = b.op("sub", x, b.op("amax", x if of is None else of, dims=(dim,), keepdim=True))
    return z, b.op("exp", z)


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
