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


#: Float rounding divisions: NumPy's kernels loop over the quotient's bits and branch on the
#: signs (fmod 45x from a quotient below 1 to 2^53); the engine's are constant-time below a
#: cap (dpnode/core/engine/division.py), which a private dividend's bounds must respect.
DIVISIONS = [
    ("float64", "fmod", 1.0, 2.0**26),
    ("float64", "remainder", 1.0, 1e300),
    ("float64", "floor_divide", 0.5, 2.0**25 * 1.01),  # a quotient above 2^26
    ("float32", "remainder", 1.0, 1.5 * 2.0**20),  # float32: up to 2^20 on the bounds
    ("float64", "fmod", 2.0**-1000, 1.0),  # a divisor below 2^-900
]


@pytest.mark.parametrize(("dtype", "op", "divisor", "hi"), DIVISIONS)
def test_a_float_division_whose_quotient_may_pass_the_cap_is_refused(
    dtype: str, op: str, divisor: float, hi: float
) -> None:
    attack = lambda b, x: b.op("clamp", b.op(op, x, divisor), 0.0, 1.0)  # noqa: E731
    with pytest.raises(PrivacyTrackingError, match="the time of the answer would show"):
        _track(dtype, attack, 0.0, hi)


@pytest.mark.parametrize(
    ("dtype", "op", "divisor", "lo", "hi"),
    [
        ("float64", "fmod", 1.0, -(2.0**24), 2.0**24),
        ("float64", "floor_divide", 10.0, 0.0, 120.0),  # ages into decades
        ("float32", "remainder", -0.25, -1000.0, 1000.0),
        ("int64", "remainder", 7, -(2.0**40), 2.0**40),  # integers: constant time at any size
        ("float64", "trunc_divide", 1e-300, 0.0, 1.0),  # trunc(x / v): one division
    ],
)
def test_a_division_below_the_cap_is_tracked(
    dtype: str, op: str, divisor: float, lo: float, hi: float
) -> None:
    _track(dtype, lambda b, x: b.op("clamp", b.op(op, x, divisor), -1e9, 1e9), lo, hi)


def test_a_dividend_pinned_to_one_value_may_lie_beyond_the_cap() -> None:
    pinned = lambda b, x: b.op("fmod", b.op("clamp", x, 1e300, 1e300), 3.0)  # noqa: E731
    _track("float64", pinned, 0.0, 1.0)


@pytest.mark.parametrize(
    ("dtype", "p", "lo", "hi"),
    [
        ("float64", 2.5, 0.0, 1.0),  # a base of 0 (27 ms against 5 per million)
        ("float64", 17.0, -1.0, 1.0),  # a negative base (171 ms against 5 at 7)
        ("float64", 1.7, 1.0, 1e200),  # the result overflows
        ("float64", 2.5, 1e-200, 1.0),  # the result underflows
        ("float32", 2.5, 1.0, 1e20),
        ("float16", 3.0, -1.0, 1.0),  # float16 goes through the library's pow
    ],
)
def test_a_private_base_that_may_reach_pows_slow_range_is_refused(
    dtype: str, p: float, lo: float, hi: float
) -> None:
    attack = lambda b, x: b.op("clamp", b.op("pow", x, p), 0.0, 1.0)  # noqa: E731
    with pytest.raises(PrivacyTrackingError, match="the time of the answer would show"):
        _track(dtype, attack, lo, hi)


@pytest.mark.parametrize(
    ("dtype", "p", "lo", "hi"),
    [
        ("float64", 2.5, 1e-3, 1e3),
        ("float32", 1.7, 1e-3, 1e3),
        ("float64", 3.0, -1.0, 1.0),  # x * x * x, as torch computes it
        ("float64", 4.0, -1.0, 1.0),  # (x * x) * (x * x): a centred fourth moment
        ("float32", -2.0, -5.0, 5.0),  # 1 / (x * x)
        ("float64", 0.5, 0.0, 1.0),  # a square root
    ],
)
def test_a_base_inside_pows_flat_range_or_a_flat_exponent_is_tracked(
    dtype: str, p: float, lo: float, hi: float
) -> None:
    _track(dtype, lambda b, x: b.op("clamp", b.op("pow", x, p), -1e9, 1e9), lo, hi)
