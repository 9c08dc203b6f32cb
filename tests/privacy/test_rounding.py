"""Floating-point rounding is paid for: neighbours whose *computed* results differ by more
than the exact-arithmetic sensitivity exist, and the tracked sensitivity still covers them.

Each test searches float32 datasets for a pair of neighbours (one row moved between its
bounds) whose computed outputs differ by more than the analytic bound of exact
arithmetic, which shows that rounding matters for the query, and checks every pair
tried against the tracked bound with no tolerance. The evaluations are the ones a
publish runs (``plan(..., accurate=True)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, Ref, plan, run
from dpnode.core.privacy import InputSpec, PrivacyTrackingError, evaluate_tracked, track

N = 7
TRIES = 3000

Build = Callable[[GraphBuilder, Ref], Ref]


def _search(build: Build, lo: float, hi: float, analytic: float, dtype: str = "float32") -> None:
    b = GraphBuilder()
    x = b.input("x", dtype, (N,))
    graph = b.build([build(b, x)])
    report = track(graph, {"x": InputSpec.private(lo, hi)})
    out = report.outputs[0]
    # the tracker knows the query (rounding that stays with a row is already in exact_l1)
    assert out.exact_l1 == pytest.approx(analytic, rel=1e-4)
    p = plan(graph, accurate=True)
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(TRIES):
        d1 = rng.uniform(lo, hi, N).astype(dtype)
        d2 = d1.copy()
        row = int(rng.integers(N))
        d1[row], d2[row] = lo, hi  # the row at both ends: the analytic bound is reached
        a = run(p, {"x": d1}).outputs[0].astype(np.float64)
        c = run(p, {"x": d2}).outputs[0].astype(np.float64)
        diff = math.fsum(np.abs(a - c).ravel().tolist())
        assert diff <= out.l1, (d1, d2, diff, out.l1)
        worst = max(worst, diff)
    # exact arithmetic alone would have been broken: the rounding allowance is needed
    assert worst > analytic, (worst, analytic)
    assert out.l1 >= worst


def test_float32_mean_needs_its_rounding() -> None:
    _search(lambda b, x: b.op("mean", x), 0.0, 1.0, 1.0 / N)


def test_float32_sum_of_products_needs_its_rounding() -> None:
    # x * 0.1 rounds in float32 before the sum: each row's own rounding moves with it
    _search(lambda b, x: b.op("sum", b.op("mul", x, 0.1)), 0.0, 3.0, 0.3)


def test_float32_sum_of_exponentials_needs_its_rounding() -> None:
    _search(lambda b, x: b.op("sum", b.op("exp", x)), 0.0, 1.0, math.e - 1)


def test_float64_mean_of_a_million_rows_pays_little() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (1_000_000,))
    out = track(b.build([b.op("mean", x)]), {"x": InputSpec.private(0.0, 100.0)}).outputs[0]
    assert out.exact_l1 == pytest.approx(100.0 / 1_000_000, rel=1e-12)
    # summed in blocks of 2048, each term goes through at most 2538 roundings: twice
    # gamma_2540 * sum|x| / n, where one pass would have been gamma_1000000 (400x more)
    assert 0 < out.rounding_l1 < 1e-6 * out.exact_l1


def test_integer_valued_float_sums_stay_exact() -> None:
    # a count in float32 ((x > t).float().sum()) adds integers below 2**24: no rounding
    b = GraphBuilder()
    x = b.input("x", "float64", (1000,))
    hit = b.op("convert_element_type", b.op("gt", x, 0.5), dtype="float32")
    out = track(b.build([b.op("sum", hit)]), {"x": InputSpec.private(0.0, 1.0)}).outputs[0]
    assert (out.exact_l1, out.rounding_l1) == (1.0, 0.0)


def test_comparisons_of_computed_values_keep_one_row_per_subject() -> None:
    # 3 * 0.1 > 0.3 in float64 although not in exact arithmetic: the comparison sees the
    # computed value, whose rounding stays with its row, so a count still moves by 1
    b = GraphBuilder()
    x = b.input("x", "float64", (50,))
    hit = b.op("gt", b.op("mul", x, 0.1), 0.3)
    graph = b.build([b.op("sum", hit)])
    specs = {"x": InputSpec.private(0.0, 10.0)}
    out = track(graph, specs).outputs[0]
    assert out.exact_l1 == 1.0 and out.rounding_l1 == 0.0
    values, _ = evaluate_tracked(graph, {"x": np.full(50, 3.0)}, specs)
    assert int(values[0]) == 50  # every row rounded past the threshold


def test_float32_contraction_over_many_rows_accumulates_in_float64() -> None:
    # X.T @ y over 100k float32 rows: accumulated in float32, the worst-case rounding of
    # the sum would exceed a row's whole contribution many times over
    n, k = 100_000, 3
    b = GraphBuilder()
    xs = b.input("X", "float32", (n, k))
    ys = b.input("y", "float32", (n,))
    graph = b.build([b.op("matmul", b.op("permute", xs, dims=(1, 0)), ys)])
    specs = {"X": InputSpec.private(-1.0, 1.0), "y": InputSpec.private(-1.0, 1.0)}
    out = track(graph, specs).outputs[0]
    assert out.exact_l1 == pytest.approx(2.0 * k, rel=1e-6)
    # what is left is the float32 result's own last bit (an ulp of 1e5 is 2**-7)
    assert out.rounding_l1 < 1e-2 * out.exact_l1
    rng = np.random.default_rng(0)
    data = {
        "X": rng.uniform(-1, 1, (n, k)).astype(np.float32),
        "y": rng.uniform(-1, 1, n).astype(np.float32),
    }
    values, _ = evaluate_tracked(graph, data, specs)
    exact = data["X"].astype(np.float64).T @ data["y"].astype(np.float64)
    assert np.array_equal(values[0], exact.astype(np.float32))  # one rounding, at the end


def test_float32_sigmoid_of_wide_logits_stays_bounded() -> None:
    # 1 / (1 + exp(-z)) with |z| up to 17: 1 + exp(-z) reaches 2e7, whose float32 ulp is 2;
    # the rounding of that sum is relative to each result, so its lower end stays near 1
    # and the reciprocal stays in (0, 1] (an error of ulp(2e7) everywhere would have
    # reached 0 and made every gradient unbounded)
    k = 20
    w = np.full(k, 0.85, dtype=np.float32)
    b = GraphBuilder()
    xs = b.input("X", "float32", (1000, k))
    z = b.op("matmul", xs, b.constant(w))
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    graph = b.build([p, b.op("mean", p)])
    report = track(graph, {"X": InputSpec.private(-1.0, 1.0)})
    rows, mean = report.outputs
    assert rows.lower.min() > 0 and rows.upper.max() < 1 + 1e-6
    assert mean.exact_l1 == pytest.approx(1 / 1000, rel=1e-3)
    assert mean.rounding_l1 < 1e-3 * mean.exact_l1


def test_tracking_takes_an_accurate_plan_and_refuses_a_plain_one() -> None:
    # a publish plans once (to check quotas) and tracks on that plan; the rounding bounds
    # hold only for float64 accumulation, so a plan of the plain engine is refused
    b = GraphBuilder()
    x = b.input("x", "float32", (5000,))
    graph = b.build([b.op("mean", x)])
    specs = {"x": InputSpec.private(0.0, 1.0)}
    data = {"x": np.random.default_rng(3).uniform(0, 1, 5000).astype(np.float32)}
    planned = plan(graph, accurate=True)
    assert track(planned, specs).l1 == track(graph, specs).l1 > 1 / 5000
    assert (
        evaluate_tracked(planned, data, specs)[0][0] == evaluate_tracked(graph, data, specs)[0][0]
    )
    with pytest.raises(ValueError, match="accurate=True"):
        track(plan(graph), specs)
    with pytest.raises(ValueError, match="accurate=True"):
        evaluate_tracked(plan(graph), data, specs)


def test_subnormal_moments_are_covered_by_the_trackers_own_rounding() -> None:
    # x*x lies in the subnormal range, where a product errs by up to half of the smallest
    # subnormal absolutely, not relatively: the tracker's own arithmetic (computing the
    # bound) rounds so too, and a relative margin alone reported 3.35103e-318 for a change
    # of 3.35104e-318 (a case found by the fuzz test of tests/privacy/test_subjects.py)
    n, hi = 6, 2.00530162e-159
    b = GraphBuilder()
    x = b.input("x", "float64", (n, 1))
    centred = b.op("sub", x, b.op("mean", x, dims=[0], keepdim=True))
    graph = b.build([b.op("sum", b.op("mul", centred, centred), dims=[0])])
    report = track(graph, {"x": InputSpec.private(0.0, hi)})
    bound = report.outputs[0].l2
    p = plan(graph, accurate=True)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        d1 = np.where(rng.random((n, 1)) < 0.5, 0.0, hi)
        d2 = d1.copy()
        d2[rng.integers(n)] = rng.choice([0.0, hi, rng.uniform(0, hi)])
        a, c = (run(p, {"x": d}).outputs[0].astype(np.float64) for d in (d1, d2))
        assert float(np.abs(a - c).max()) <= bound


@pytest.mark.parametrize("outputs", [1, 2, 5])
@pytest.mark.parametrize("hi", [1.0, 1e-100, 1e-160, 1e-170, 1e-300, 1e-310, 1e150, 1e300])
def test_the_joint_sensitivity_of_all_outputs_covers_each_at_any_magnitude(
    outputs: int, hi: float
) -> None:
    # the mechanism is calibrated to the report's L1 and L2 over all outputs: its L2 came
    # from squares, and a lone sum of values in [0, 1e-170] had a joint L2 of 0, so the
    # Gaussian released it without noise; its squares of 1e150 overflowed (a refusal)
    from fractions import Fraction

    from dpnode.core.privacy.release import plan_release, run_release

    b = GraphBuilder()
    x = b.input("x", "float64", (40,))
    scales = [1.0, 0.5, 0.25, 2.0**-60, 1e-30][:outputs]
    graph = b.build([b.op("sum", b.op("mul", x, s)) for s in scales])
    specs = {"x": InputSpec.private(0.0, hi, np.arange(40) % 8)}  # 5 rows a subject
    report = track(graph, specs)
    per_l1 = [[Fraction(float(v)) for v in o.per_subject_l1] for o in report.outputs]
    per_l2 = [[Fraction(float(v)) for v in o.per_subject_l2] for o in report.outputs]
    exact_l1 = max(sum(col) for col in zip(*per_l1, strict=True))
    exact_l2_squared = max(sum(v * v for v in col) for col in zip(*per_l2, strict=True))
    assert exact_l1 > 0 and exact_l2_squared > 0
    assert Fraction(report.l1) >= exact_l1
    assert Fraction(report.l2) ** 2 >= exact_l2_squared
    assert report.l2 <= report.l1  # and not loose: no worse than the L1 bound
    # so the Gaussian adds noise: releases of the exact sums would all be the same
    rp = plan_release(plan(graph, accurate=True), specs, epsilon=1.0, delta=1e-6)
    assert rp.noise.sensitivity >= report.l2 and rp.noise.scale > 0
    data = {"x": np.random.default_rng(1).uniform(0, hi, 40)}
    released = {tuple(map(float, run_release(rp, data).values)) for _ in range(30)}
    assert len(released) > 1  # (each is clipped to its range: at 1e-310, 0 half the time)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_a_choice_rounds_what_it_picks_and_not_its_condition_or_index(dt: str) -> None:
    # a float16 choice is computed in float32: a picked value of another dtype is rounded
    # to the result, a bool condition or an integer index is not a value it picks
    def bounds(build: Callable[[GraphBuilder, Ref], Ref]) -> tuple[float, float]:
        b = GraphBuilder()
        out = track(b.build([build(b, b.input("x", dt, (4,)))]), {"x": InputSpec.private(0, 1)})
        return float(np.min(out.outputs[0].lower)), float(np.max(out.outputs[0].upper))

    ulp = 2.0 ** -(11 if dt == "float16" else 8)  # a rounding to the result: half an ulp of 1
    idx = np.array([3, 0], dtype=np.int64)
    for picks in (
        lambda b, x: b.op("where", b.op("gt", x, 0.5), x, b.op("neg", x)),
        lambda b, x: b.op("gather", x, b.constant(idx), dim=0),
        lambda b, x: b.op("index_select", x, b.constant(idx), dim=0),
        lambda b, x: b.op("index", x, b.constant(idx)),
    ):
        lo, hi = bounds(picks)
        assert hi == pytest.approx(1, abs=ulp / 100) and lo in (0, pytest.approx(-1, abs=ulp / 100))
    wide = np.full(4, 2049, dtype=np.int64)  # not a float16 (nor a bfloat16): rounded
    assert bounds(lambda b, x: b.op("where", b.op("gt", x, 0.5), x, b.constant(wide)))[1] > 2049


def test_operands_the_kernel_narrows_are_tracked_as_narrowed() -> None:
    # the kernel casts a wider operand (a 0-d float64 constant or tensor of a float32 one,
    # a Python scalar of a float16 choice) to its compute dtype and rounds a choice to the
    # result's; the tracker used their exact values: 1e-20 - x was 0 in float32 for the x
    # nearest 1e-20 and tracked as at least 3e-28; float16 maximum(x, 1e-20) was 0 and
    # tracked as at least 1e-20 (a log of either, summed, jumped to -inf at the release)
    import ml_dtypes

    from tests.privacy.helpers import assert_sound

    def computed_within(graph: Any, specs: dict[str, InputSpec], data: dict[str, Any]) -> None:
        out = track(graph, specs).outputs[0]
        got = run(plan(graph, accurate=True), data).outputs[0].astype(np.float64)
        assert np.all(got >= out.lower) and np.all(got <= out.upper), (got, out.lower, out.upper)

    x32 = float(np.float32(1e-20))
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    graph = b.build([b.op("sub", b.constant(np.array(1e-20)), x)])
    specs = {"x": InputSpec.private(-1.0, x32)}
    computed_within(graph, specs, {"x": np.full(4, x32, dtype=np.float32)})
    logged = b.build([b.op("sum", b.op("log", b.op("sub", b.constant(np.array(1e-20)), x)))])
    with pytest.raises(PrivacyTrackingError, match="unbounded"):  # the log of a possible 0
        track(logged, specs)

    for dt, scalar in (("float16", 1e-20), ("bfloat16", 1e20)):
        b = GraphBuilder()
        x = b.input("x", dt, (2,))
        graph = b.build([b.op("maximum", x, scalar)])
        values = np.array([-1.0, 0.0]).astype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)
        computed_within(graph, {"x": InputSpec.private(-1.0, 1.0)}, {"x": values})

    b = GraphBuilder()
    x = b.input("x", "float32", (8,))
    m = b.op("sum", b.input("m", "float64", (8,)))  # a private 0-d float64
    graph = b.build([b.op("sum", b.op("sub", x, m))])
    specs = {"x": InputSpec.private(0.0, 1.0), "m": InputSpec.private(0.0, 1e10)}
    report = track(graph, specs)
    d1 = {"x": np.full(8, 0.5, dtype=np.float32), "m": np.full(8, 1e10 / 3)}
    d2 = {"x": d1["x"].copy(), "m": d1["m"].copy()}
    d2["m"][0] = 1e10
    assert_sound(graph, report, d1, d2)


def test_a_where_of_a_0d_float64_and_a_float32_tensor_carries_the_cast() -> None:
    """``where(c, m, y)`` with ``m`` a private 0-d float64 and ``y`` a float32 tensor is
    float32: ``m`` is rounded to it, and a mean of 1/3 becomes 0.33333334, more than the
    mean's change of 1/3 (found by the random attack: L1 6.00000018 > 6)."""
    b = GraphBuilder()
    x = b.input("x", "float64", (3,))
    y = b.input("y", "float32", (3,))
    graph = b.build([b.op("where", b.op("ge", x, 0.0), b.op("mean", x), y)])
    specs = {"x": InputSpec.private(0.0, 1.0), "y": InputSpec.private(0.0, 0.0)}
    report = track(graph, specs)
    d1 = {"x": np.zeros(3), "y": np.zeros(3, dtype=np.float32)}
    d2 = {"x": np.array([1.0, 0.0, 0.0]), "y": d1["y"]}
    from tests.privacy.helpers import assert_sound

    assert_sound(graph, report, d1, d2)
    assert_sound(graph, report, d2, d1)
