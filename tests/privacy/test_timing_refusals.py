"""Kernels whose time depends on where their argument lies are refused, from the bounds
alone, on private arguments that may reach their slow range.

An analyst who steers private values into a kernel's slow range and clamps the result
afterwards (so the sensitivity stays small) reads a count from the clock: through the node,
``sum(clamp(sinh(700 x), 0, 1))`` took 21 ms on a million rows of 0 and 107 ms on a million
rows of 1, at epsilon 0.001 (the ratios of each kernel: ``python -m bench.side_channels
--kernels``). These tests check the decision, not the time: timing belongs to benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, Ref
from dpnode.core.privacy import InputSpec, PrivacyTrackingError, track
from dpnode.core.privacy.rules.unary import FUNCTIONS, TIMING_FLAT

Build = Callable[[GraphBuilder, Ref], Ref]

#: The attacks found: each keeps its output in [0, 1] (or [-1, 1]) whatever the row holds.
ATTACKS: list[tuple[str, Build]] = [
    ("float64", lambda b, x: b.op("clamp", b.op("sinh", b.op("mul", x, 700.0)), 0.0, 1.0)),
    ("float32", lambda b, x: b.op("clamp", b.op("sinh", b.op("mul", x, 88.0)), 0.0, 1.0)),
    ("float64", lambda b, x: b.op("clamp", b.op("cosh", b.op("mul", x, 709.0)), 0.0, 1.0)),
    ("float64", lambda b, x: b.op("sin", b.op("mul", x, 1e22))),
    ("float32", lambda b, x: b.op("cos", b.op("mul", x, 1e6))),
    ("float64", lambda b, x: b.op("clamp", b.op("exp", b.op("mul", x, -720.0)), 0.0, 1.0)),
    ("float32", lambda b, x: b.op("clamp", b.op("exp2", b.op("mul", x, 127.0)), 0.0, 1.0)),
    ("float64", lambda b, x: b.op("clamp", b.op("expm1", b.op("mul", x, 709.5)), 0.0, 1.0)),
    ("float64", lambda b, x: b.op("clamp", b.op("log", x), -1.0, 0.0)),  # log(0)
    ("float32", lambda b, x: b.op("clamp", b.op("log1p", b.op("neg", x)), -1.0, 0.0)),
    ("float64", lambda b, x: b.op("clamp", b.op("atanh", x), 0.0, 1.0)),  # atanh(1)
]


def _track(dtype: str, build: Build, lo: float = 0.0, hi: float = 1.0) -> None:
    b = GraphBuilder()
    x = b.input("x", dtype, (8,))
    track(b.build([b.op("sum", build(b, x))]), {"x": InputSpec.private(lo, hi)})


@pytest.mark.parametrize(("dtype", "build"), ATTACKS)
def test_a_private_argument_that_may_reach_a_slow_range_is_refused(
    dtype: str, build: Build
) -> None:
    with pytest.raises(PrivacyTrackingError, match="the time of the answer would show"):
        _track(dtype, build)


@pytest.mark.parametrize(
    ("dtype", "build", "lo", "hi"),
    [
        ("float64", lambda b, x: b.op("sinh", b.op("mul", x, 600.0)), 0.0, 1.0),
        ("float64", lambda b, x: b.op("sin", b.op("mul", x, 500.0)), -1.0, 1.0),
        ("float64", lambda b, x: b.op("exp", x), -700.0, 700.0),
        ("float32", lambda b, x: b.op("exp", x), -1000.0, 80.0),  # float32's is flat
        ("float64", lambda b, x: b.op("log", x), 1e-300, 1.0),
        # float32's is flat at 0 too
        ("float32", lambda b, x: b.op("clamp", b.op("log", x), -1.0, 0.0), 0.0, 1.0),
        ("float64", lambda b, x: b.op("tanh", b.op("mul", x, 1e6)), -1.0, 1.0),  # not listed
    ],
)
def test_an_argument_inside_the_flat_range_is_tracked_as_before(
    dtype: str, build: Build, lo: float, hi: float
) -> None:
    _track(dtype, build, lo, hi)


def test_a_private_value_pinned_to_one_point_or_a_public_one_may_lie_anywhere() -> None:
    # one value, whatever the data: the same path, the same time on every neighbour
    _track("float64", lambda b, x: b.op("sinh", b.op("clamp", b.op("mul", x, 1e3), 700.0, 700.0)))
    b = GraphBuilder()
    x = b.input("x", "float64", (8,))
    far = b.op("clamp", b.op("sinh", b.constant(np.full(8, 700.0))), 0.0, 1.0)
    track(b.build([b.op("sum", b.op("mul", x, far))]), {"x": InputSpec.private(0.0, 1.0)})


def test_the_refusal_says_where_to_clamp() -> None:
    with pytest.raises(PrivacyTrackingError) as refused:
        _track("float64", lambda b, x: b.op("sinh", b.op("mul", x, 700.0)))
    assert "outside [-640, 640] (float64)" in str(refused.value)
    assert "Clamp the argument into that range first" in str(refused.value)


def test_every_listed_kernel_has_a_rule_and_ranges_that_hold_a_value() -> None:
    for name, ranges in TIMING_FLAT.items():
        assert name in FUNCTIONS, name
        assert any(r is not None for r in ranges), name
        for r in ranges:
            assert r is None or r[0] < r[1], (name, r)
