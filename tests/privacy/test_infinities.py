"""Infinities that meet make NaN, and a NaN the tracker did not foresee is a leak.

A value the tracker bounds by ``[a, inf]`` may *be* infinite once computed (``exp(1000)``
overflows). Two such values of opposite signs added (``inf - inf``), a sum or product over
them, or ``0 * inf`` give NaN, and a squashing function after them (``tanh``, ``clamp``)
has finite bounds again, so the output looks tracked. The release then replaces the NaN by a
public stand-in: the answer jumps across the output's whole range when *one* row makes the
NaN, far beyond the sensitivity charged (an analyst learns whether any row's value exceeds a
threshold, at any epsilon). Each graph below must be refused, or give no NaN on datasets
chosen to make one.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, Ref, plan, run
from dpnode.core.privacy import InputSpec, PrivacyTrackingError, track
from tests.privacy.helpers import assert_sound

N = 4
SIGNS = np.array([1.0, -1.0, 1.0, -1.0])

Build = Callable[[GraphBuilder, Ref, Ref], Ref]


def _exp(b: GraphBuilder, v: Ref) -> Ref:
    return b.op("exp", v)  # [1, inf]: exp(1000) overflows


GRAPHS: dict[str, Build] = {
    "sub": lambda b, x, y: b.op("sub", _exp(b, x), _exp(b, y)),
    "add of a negation": lambda b, x, y: b.op("add", _exp(b, x), b.op("neg", _exp(b, y))),
    "sum of signed terms": lambda b, x, y: b.op(
        "sum", b.op("mul", _exp(b, x), b.constant(SIGNS)), dims=[0], keepdim=True
    ),
    "mean of signed terms": lambda b, x, y: b.op(
        "mean", b.op("mul", _exp(b, x), b.constant(SIGNS)), dims=[0], keepdim=True
    ),
    "cumsum of signed terms": lambda b, x, y: b.op(
        "cumsum", b.op("mul", _exp(b, x), b.constant(SIGNS)), dim=0
    ),
    "matmul with signed weights": lambda b, x, y: b.op(
        "matmul", b.op("unsqueeze", _exp(b, x), dim=0), b.constant(SIGNS[:, None])
    ),
    "matmul of two private factors": lambda b, x, y: b.op(
        "matmul",
        b.op("unsqueeze", _exp(b, x), dim=0),
        b.op("unsqueeze", b.op("neg", _exp(b, y)), dim=1),
    ),
    "times zero": lambda b, x, y: b.op("mul", _exp(b, x), b.constant(np.zeros(N))),
    "ratio of infinities": lambda b, x, y: b.op("div", _exp(b, x), _exp(b, y)),
    "product over rows": lambda b, x, y: b.op(
        "prod", b.op("mul", _exp(b, x), b.op("exp", b.op("neg", y))), dims=[0], keepdim=True
    ),
}


@pytest.mark.parametrize("squash", ["tanh", "clamp"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_meeting_infinities_are_refused_or_never_nan(name: str, squash: str) -> None:
    b = GraphBuilder()
    x, y = b.input("x", "float64", (N,)), b.input("y", "float64", (N,))
    v = GRAPHS[name](b, x, y)
    v = b.op("tanh", v) if squash == "tanh" else b.op("clamp", v, -1.0, 1.0)
    graph = b.build([b.op("sum", v)])
    spec = InputSpec.private(0.0, 1000.0)
    try:
        report = track(graph, {"x": spec, "y": spec})
    except PrivacyTrackingError:
        return  # refused before any value is read: nothing to leak
    p = plan(graph, accurate=True)
    for values in (1000.0, 999.0, 0.0):
        data = {"x": np.full(N, 1000.0), "y": np.full(N, values)}
        with np.errstate(all="ignore"):
            out = float(run(p, data).outputs[0])
        assert not np.isnan(out), f"tracked (range {report.outputs[0].lower}) yet NaN"


def test_a_value_that_always_overflows_is_not_tracked_as_exact() -> None:
    # exp(800) is inf in float32 on every dataset: the error bound of its rounding is
    # inf - inf, which once counted as no error at all; atan(inf) then claimed the exact
    # pi/2, which float32 rounds above (a case found by the attack test)
    b = GraphBuilder()
    y = b.input("y", "float32", (2,))
    graph = b.build([b.op("atan", b.op("exp", b.op("mul", y, -800.0)))])
    try:
        report = track(graph, {"y": InputSpec.private(-1.0, -1.0)})
    except PrivacyTrackingError:
        return
    with np.errstate(all="ignore"):
        out = run(plan(graph, accurate=True), {"y": np.full(2, -1.0, np.float32)}).outputs[0]
    assert np.all(out.astype(np.float64) <= report.outputs[0].upper)


M = 16
ALTERNATING = np.resize(SIGNS, M) * 1e308

FINITE: dict[str, Callable[[GraphBuilder, Ref], Ref]] = {
    # finite terms of both signs whose partial sums overflow apart: NumPy adds 16 terms in
    # 8 interleaved partial sums, so one is 1e308 + 1e308 = inf and the next -inf
    "sum of huge terms": lambda b, x: b.op(
        "sum", b.op("mul", x, b.constant(ALTERNATING)), dims=[0], keepdim=True
    ),
    "matmul of huge terms": lambda b, x: b.op(
        "matmul", b.op("unsqueeze", x, dim=0), b.constant(ALTERNATING[:, None])
    ),
    # a negative base to a fractional power
    "square root by pow": lambda b, x: b.op("pow", b.op("sub", x, 0.5), 0.5),
    "cube root by pow": lambda b, x: b.op("pow", b.op("sub", x, 0.5), 1 / 3),
}


@pytest.mark.parametrize("name", sorted(FINITE))
def test_finite_values_that_make_nan_are_refused_or_never_nan(name: str) -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (M,))
    graph = b.build([b.op("sum", b.op("tanh", FINITE[name](b, x)))])
    try:
        track(graph, {"x": InputSpec.private(0.0, 1.0)})
    except PrivacyTrackingError:
        return
    p = plan(graph, accurate=True)
    for value in (1.0, 0.0, 0.25):
        with np.errstate(all="ignore"):
            out = float(run(p, {"x": np.full(M, value)}).outputs[0])
        assert not np.isnan(out)


@pytest.mark.parametrize("predicate", ["isnan", "isfinite", "isinf", "gt", "cast"])
def test_a_predicate_of_a_value_that_may_be_nan_moves_with_any_subject(predicate: str) -> None:
    # 0 * m is NaN when m, a sum over every row, overflows: whether it is NaN depends on
    # any row, though 0 * m "does not move". isnan of it was tracked as public (released
    # with no noise at all: whether any row exceeds a threshold, at epsilon 0)
    b = GraphBuilder()
    x = b.input("x", "float64", (N,))
    m = b.op("sum", b.op("exp", b.op("mul", x, 800.0)))  # inf when a row exceeds ~0.887
    z = b.op("mul", b.op("unsqueeze", m, dim=0), b.constant(np.zeros(N)))  # N elements
    if predicate == "gt":
        flag = b.op("gt", z, -1.0)
    elif predicate == "cast":
        flag = b.op("convert_element_type", z, dtype="int64")
    else:
        flag = b.op(predicate, z)
    graph = b.build([b.op("sum", b.op("convert_element_type", flag, dtype="float64"))])
    try:
        report = track(graph, {"x": InputSpec.private(0.0, 1.0)})
    except PrivacyTrackingError:
        return
    p = plan(graph, accurate=True)
    with np.errstate(all="ignore"):
        calm, wild = (float(run(p, {"x": v}).outputs[0]) for v in (np.zeros(N), np.eye(N)[0]))
    assert abs(calm - wild) <= report.outputs[0].l1


HUGE: dict[str, tuple[Callable[[GraphBuilder, Ref], Ref], tuple[float, float]]] = {
    # x + x: widths near the largest float, whose sum is not a float (the tracker crashed
    # with an OverflowError; it refuses the unbounded sum)
    "sum of widths beyond the largest float": (lambda b, x: b.op("add", x, x), (0.0, 8.5e307)),
    # 1e300 / x: max|a| / min|b|^2 overflowed, so the divisor's change counted for 0
    "a huge divisor": (
        lambda b, x: b.op("sum", b.op("div", b.constant(np.full(2, 1e300)), x)),
        (1e300, 2e300),
    ),
    # x ** -0.5: the slope 0.5 * (1e300) ** -1.5 underflowed to 0
    "a slope that underflows": (lambda b, x: b.op("sum", b.op("pow", x, -0.5)), (1e300, 2e300)),
}


@pytest.mark.parametrize("name", sorted(HUGE))
def test_huge_magnitudes_are_tracked_soundly(name: str) -> None:
    build, (lo, hi) = HUGE[name]
    b = GraphBuilder()
    x = b.input("x", "float64", (2,))
    graph = b.build([build(b, x)])
    try:
        report = track(graph, {"x": InputSpec.private(lo, hi)})
    except PrivacyTrackingError:
        return  # refused with its reason, not a crash
    p = plan(graph, accurate=True)
    ends = [np.array([lo, lo]), np.array([hi, lo]), np.array([hi, hi])]
    with np.errstate(all="ignore"):
        outs = [run(p, {"x": v}).outputs[0].astype(np.float64) for v in ends]
    for a, c in itertools.pairwise(outs):
        assert math.fsum(np.abs(a - c).reshape(-1).tolist()) <= report.outputs[0].l1


@pytest.mark.parametrize("bound", [1e308, 1.7e308])
def test_integer_bounds_wider_than_the_float_range_are_tracked(bound: float) -> None:
    # their width overflowed to inf, and the tracker's small-domain tables raised a bare
    # OverflowError (int(inf)) where the values' own range (int64's) is what counts
    b = GraphBuilder()
    x = b.input("x", "int64", (10,))
    graph = b.build([b.op("sum", x)])
    report = track(graph, {"x": InputSpec.private(-bound, bound)})
    assert report.l1 == pytest.approx(2.0**64, rel=1e-6)


@pytest.mark.parametrize("constant", [math.inf, -math.inf])
def test_an_infinite_constant_added_to_a_small_integer_column_is_refused_cleanly(
    constant: float,
) -> None:
    # a small integer domain is tracked as a table of its values; the constant made them
    # all infinite, the table's spread inf - inf was NaN (a RuntimeWarning in the node's
    # log) and only the later check refused it: the spread now says "no information"
    b = GraphBuilder()
    x = b.input("x", "int64", (10,))
    graph = b.build(
        [b.op("sum", b.op("add", b.op("convert_element_type", x, dtype="float64"), constant))]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PrivacyTrackingError, match="unbounded"):
            track(graph, {"x": InputSpec.private(0, 120)})


@pytest.mark.parametrize("offset", [0, 1000])
def test_an_int64_sum_whose_bound_rounds_to_2_63_is_seen_to_wrap(offset: int) -> None:
    # the tracker's bounds are float64, where int64's largest value rounds to 2^63: a sum
    # whose exact bound was 2^63 (or a little above) was not seen to wrap, and it did, by
    # the whole range, against a tracked change of one row's
    n, top = 1000, 1000
    c = 2**63 - n * top + offset  # sum(x) + c wraps iff sum(x) >= n * top - offset
    b = GraphBuilder()
    x = b.input("x", "int64", (n,))
    graph = b.build([b.op("add", b.op("sum", x), c)])
    report = track(graph, {"x": InputSpec.private(0, top)})
    d1 = {"x": np.full(n, top, dtype=np.int64)}
    d1["x"][:2] = 0
    d2 = {"x": d1["x"].copy()}
    d2["x"][0] = top  # its sum now wraps past 2^63 - 1 when offset > 0
    assert_sound(graph, report, d1, d2)


def test_an_integer_beyond_2_53_is_charged_for_its_conversion_to_float64() -> None:
    # a count offset by 2^62 moves by 2 inside int64, but by 1024 once the release converts
    # it to float64 (across a rounding boundary): an analyst learned the count, crossing a
    # boundary of their choice, through noise for a change of 2
    n = 10
    b = GraphBuilder()
    x = b.input("x", "int64", (n,))
    graph = b.build([b.op("add", b.op("sum", x), 2**62 + 511)])
    report = track(graph, {"x": InputSpec.private(0, 2)})
    d1 = {"x": np.zeros(n, dtype=np.int64)}
    d2 = {"x": d1["x"].copy()}
    d2["x"][0] = 2
    assert_sound(graph, report, d1, d2)
    assert report.outputs[0].l1 >= 1024


def test_a_cast_to_bfloat16_overflows_at_its_own_largest_value() -> None:
    # bfloat16's largest finite value is 3.3895e38, not float32's 3.4028e38: a float32 in
    # between became inf in the engine and was tracked as finite (the sum then jumped by
    # the whole range at the release); now such a graph is refused as unbounded
    n = 16
    b = GraphBuilder()
    x = b.input("x", "float32", (n,))
    y = b.op(
        "convert_element_type", b.op("convert_element_type", x, dtype="bfloat16"), dtype="float64"
    )
    graph = b.build([b.op("sum", y)])
    with pytest.raises(PrivacyTrackingError, match="unbounded"):
        track(graph, {"x": InputSpec.private(3.0e38, float(np.float32(3.4e38)))})
    report = track(graph, {"x": InputSpec.private(3.0e38, 3.38e38)})  # within: tracked
    d1 = {"x": np.full(n, 3.0e38, dtype=np.float32)}
    d2 = {"x": d1["x"].copy()}
    d2["x"][0] = 3.38e38
    assert_sound(graph, report, d1, d2)


@pytest.mark.parametrize("op", ["matmul", "convolution"])
def test_a_float32_product_beyond_float32_is_refused_where_it_accumulates_in_float32(
    op: str,
) -> None:
    # a short contraction accumulates in float32: x * 1e10 above 3.4e38 overflowed to inf
    # (x - y of two such products: NaN or inf) while the exact result, tracked in float64,
    # was finite; the release clipped it to a bound, a jump far beyond the tracked change
    n = 16
    b = GraphBuilder()
    x = b.input("x", "float32", (n, 2))
    w = np.array([[1e10], [-1e10]], dtype=np.float32)
    if op == "matmul":
        y = b.op("matmul", x, b.constant(w))
    else:
        y = b.op(
            "convolution",
            b.op("unsqueeze", x, dim=1),
            b.constant(w.reshape(1, 1, 2)),
            None,
            stride=(1,),
            padding=(0,),
            dilation=(1,),
            groups=1,
        )
    graph = b.build([b.op("sum", y)])
    lo = float(np.float32(3.3e28))
    with pytest.raises(PrivacyTrackingError, match="unbounded"):
        track(graph, {"x": InputSpec.private(lo, float(np.float32(3.5e28)))})
    hi = float(np.float32(3.3e27))  # products within float32: tracked, and sound
    report = track(graph, {"x": InputSpec.private(float(np.float32(3.0e27)), hi)})
    d1 = {"x": np.full((n, 2), 3.0e27, dtype=np.float32)}
    d2 = {"x": d1["x"].copy()}
    d2["x"][0, 0] = hi
    assert_sound(graph, report, d1, d2)
