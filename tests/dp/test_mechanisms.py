"""Mechanisms: outputs on the grid, the noise law, the charge, and refusals."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.dp import Charge, gaussian, gaussian_scale, laplace, laplace_scale
from dpnode.core.dp.accounting import calibrate_rho
from dpnode.core.dp.grid import FINENESS_BITS, on_grid, round_to_grid
from dpnode.core.dp.mechanisms import plan_gaussian, plan_laplace
from dpnode.core.dp.samplers import MAX_SCALE
from dpnode.core.errors import EvaluationError, InvalidRequestError
from tests.dp.stats import (
    ALPHA,
    chi_square_pvalue,
    gaussian_cdf,
    gaussian_edges,
    laplace_cdf,
    laplace_edges,
)

values = st.lists(st.floats(-1e9, 1e9), min_size=1, max_size=50)


@settings(max_examples=40, deadline=None)
@given(values, st.floats(1e-6, 1e6), st.floats(1e-3, 10.0))
def test_laplace_outputs_lie_on_the_grid(xs: list[float], sens: float, eps: float) -> None:
    r = laplace(xs, sensitivity_l1=sens, epsilon=eps)
    assert r.grid_exponent is not None and on_grid(r.values, r.grid_exponent)
    assert r.values.shape == (len(xs),) and r.values.dtype == np.float64
    # The noise covers the rounded query: scale * epsilon >= its sensitivity >= the declared one.
    assert Fraction(r.scale) * Fraction(eps) >= Fraction(r.sensitivity) >= Fraction(sens)
    assert r.sensitivity <= sens * (1 + 2.0**-FINENESS_BITS) * (1 + 1e-12)
    assert r.charge == Charge(epsilon=eps, tv=r.sampler_tv)
    assert 0 < r.sampler_tv < len(xs) * 2.0**-90


@settings(max_examples=40, deadline=None)
@given(values, st.floats(1e-6, 1e6), st.floats(1e-3, 10.0))
def test_gaussian_outputs_lie_on_the_grid(xs: list[float], sens: float, rho: float) -> None:
    r = gaussian(xs, sensitivity_l2=sens, rho=rho)
    assert r.grid_exponent is not None and on_grid(r.values, r.grid_exponent)
    # CKS Theorem 14: sensitivity² / (2 scale²) <= rho, for the rounded query's sensitivity.
    assert Fraction(r.sensitivity) ** 2 <= 2 * Fraction(rho) * Fraction(r.scale) ** 2
    assert r.sensitivity >= sens
    assert r.charge == Charge(rho=rho, tv=r.sampler_tv)


def test_shape_is_kept() -> None:
    r = laplace(np.zeros((3, 4)), sensitivity_l1=1.0, epsilon=1.0)
    assert r.values.shape == (3, 4)
    r = gaussian(np.float64(2.0), sensitivity_l2=1.0, rho=1.0)
    assert r.values.shape == ()


def _noise_in_grid_units(r_values: np.ndarray, x: float, k: int) -> np.ndarray:
    base = round_to_grid(np.array([x]), k)[0]
    return (np.ldexp(r_values, -k) - base).astype(np.int64)


def test_laplace_noise_law_end_to_end() -> None:
    x, n = 123.456, 200_000
    r = laplace(np.full(n, x), sensitivity_l1=2.0, epsilon=0.5)
    assert r.grid_exponent is not None
    z = _noise_in_grid_units(r.values, x, r.grid_exponent)
    t = math.ldexp(r.scale, -r.grid_exponent)
    assert chi_square_pvalue(z, laplace_cdf(t), laplace_edges(t, 200)) > ALPHA
    assert chi_square_pvalue(z, laplace_cdf(t / 0.9), laplace_edges(t, 200)) < ALPHA


def test_gaussian_noise_law_end_to_end() -> None:
    x, n = -7.25, 200_000
    r = gaussian(np.full(n, x), sensitivity_l2=1.0, epsilon=1.0, delta=1e-6)
    assert r.grid_exponent is not None
    z = _noise_in_grid_units(r.values, x, r.grid_exponent)
    s = math.ldexp(r.scale, -r.grid_exponent)
    assert chi_square_pvalue(z, gaussian_cdf(s), gaussian_edges(s, 200)) > ALPHA
    assert r.rho == calibrate_rho(1.0, 1e-6)


def test_noise_scale_matches_the_textbook_one() -> None:
    # Laplace b = Δ/ε and Gaussian σ = Δ/sqrt(2ρ), up to the 2^-10 grid inflation.
    r = laplace([0.0], sensitivity_l1=3.0, epsilon=0.25)
    assert 12.0 <= r.scale <= 12.0 * (1 + 2.0**-FINENESS_BITS) * (1 + 1e-12)
    g = gaussian([0.0] * 100, sensitivity_l2=3.0, rho=0.125)
    assert 6.0 <= g.scale <= 6.0 * (1 + 2.0**-FINENESS_BITS) * (1 + 1e-12)


def test_zero_sensitivity_releases_the_public_values() -> None:
    r = laplace([1.5, 2.5], sensitivity_l1=0.0, epsilon=1.0)
    assert r.values.tolist() == [1.5, 2.5] and r.grid_exponent is None and r.scale == 0
    assert r.charge == Charge(epsilon=1.0)
    g = gaussian([1.5], sensitivity_l2=0.0, rho=0.5)
    assert g.values.tolist() == [1.5] and g.charge == Charge(rho=0.5)
    with pytest.raises(EvaluationError):
        laplace([np.nan], sensitivity_l1=0.0, epsilon=1.0)


def test_empty_values() -> None:
    assert laplace([], sensitivity_l1=1.0, epsilon=1.0).values.shape == (0,)


def test_huge_dimension_or_tiny_epsilon_coarsens_the_grid_and_charges_it() -> None:
    # Noise of 10^15 grid units would not fit the samplers: k is raised, inflation is charged.
    r = laplace([5.0], sensitivity_l1=1.0, epsilon=1e-12)
    assert r.grid_exponent is not None and r.grid_exponent > -FINENESS_BITS
    assert math.ldexp(r.scale, -r.grid_exponent) <= MAX_SCALE
    assert Fraction(r.scale) * Fraction(1e-12) >= Fraction(r.sensitivity) > 1.0


def test_refuses_a_privacy_parameter_no_grid_can_serve() -> None:
    # n / epsilon (or sqrt(n / 2 rho)) grid steps of rounding slack alone exceed the samplers.
    with pytest.raises(InvalidRequestError, match="epsilon=1e-300 is too small for 2 values"):
        laplace([1.0, 2.0], sensitivity_l1=1.0, epsilon=1e-300)
    with pytest.raises(InvalidRequestError, match="rho=1e-30 is too small for 2 values"):
        gaussian([1.0, 2.0], sensitivity_l2=1.0, rho=1e-30)


@pytest.mark.parametrize(
    "plan",
    [
        lambda: plan_laplace(sensitivity_l1=1.0, epsilon=1e20, count=3),
        lambda: plan_laplace(sensitivity_l1=1e-170, epsilon=5e-324, count=1),
        lambda: plan_gaussian(sensitivity_l2=1.0, epsilon=1e-100, delta=1e-100, count=3),
        lambda: plan_gaussian(sensitivity_l2=1.0, epsilon=1e100, delta=1e-6, count=3),
    ],
)
def test_epsilons_far_outside_the_nodes_range_are_refused_clearly(
    plan: Callable[[], object],
) -> None:
    # a decimal.DivisionByZero, a ZeroDivisionError and OverflowErrors before (the node
    # refuses an epsilon outside [1e-9, 1e6] first; the library's callers got these)
    with pytest.raises(InvalidRequestError, match="ask for an epsilon between 1e-9 and 1e6"):
        plan()


@pytest.mark.parametrize(
    "plan",
    [
        lambda: plan_laplace(sensitivity_l1=1e305, epsilon=1e-4, count=3),
        lambda: plan_laplace(sensitivity_l1=1e308, epsilon=0.5, count=3),
        lambda: plan_gaussian(sensitivity_l2=1e305, epsilon=1e-3, delta=1e-6, count=3),
        lambda: plan_gaussian(sensitivity_l2=1e307, rho=1e-3, count=3),
    ],
)
def test_refuses_noise_beyond_the_largest_float(plan: Callable[[], object]) -> None:
    # the grid fits the samplers, but its scale (or the rounded query's sensitivity) in
    # float64 overflowed: an OverflowError, which the node answered with a 500
    with pytest.raises(InvalidRequestError, match="would exceed the largest float64"):
        plan()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0.0}, "epsilon must be finite and > 0"),
        ({"epsilon": -1.0}, "epsilon must be finite and > 0"),
        ({"epsilon": math.nan}, "epsilon must be finite and > 0"),
        ({"epsilon": math.inf}, "epsilon must be finite and > 0"),
        ({"epsilon": "a lot"}, "epsilon must be a number"),
        ({"epsilon": 1.0, "sensitivity_l1": -1.0}, "sensitivity_l1 must be finite and >= 0"),
        ({"epsilon": 1.0, "sensitivity_l1": math.nan}, "sensitivity_l1 must be finite"),
    ],
)
def test_laplace_refuses_bad_parameters(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"sensitivity_l1": 1.0, **kwargs}
    with pytest.raises(InvalidRequestError, match=message):
        laplace([1.0], **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs rho, or epsilon and delta"),
        ({"epsilon": 1.0}, "needs rho, or epsilon and delta"),
        ({"rho": 1.0, "epsilon": 1.0}, "either rho or"),
        ({"rho": -1.0}, "rho must be finite and > 0"),
        ({"epsilon": 1.0, "delta": 0.0}, "delta must be finite and > 0"),
        ({"epsilon": 1.0, "delta": 1.0}, "delta must be < 1"),
        ({"rho": 1.0, "sensitivity_l2": math.inf}, "sensitivity_l2 must be finite"),
    ],
)
def test_gaussian_refuses_bad_parameters(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"sensitivity_l2": 1.0, **kwargs}
    with pytest.raises(InvalidRequestError, match=message):
        gaussian([1.0], **args)  # type: ignore[arg-type]


def test_refuses_nan_values_and_non_numbers() -> None:
    with pytest.raises(EvaluationError, match="NaN"):
        laplace([1.0, math.nan], sensitivity_l1=1.0, epsilon=1.0)
    with pytest.raises(EvaluationError, match="NaN"):
        gaussian([math.inf], sensitivity_l2=1.0, rho=1.0)
    with pytest.raises(InvalidRequestError, match="numeric"):
        laplace(["x"], sensitivity_l1=1.0, epsilon=1.0)


def test_large_values_keep_their_magnitude() -> None:
    # Values far above the noise are exact grid multiples; the release is still on the grid.
    r = laplace([2.0**60, -(2.0**60)], sensitivity_l1=1.0, epsilon=1.0)
    assert r.grid_exponent is not None and on_grid(r.values, r.grid_exponent)
    assert np.all(np.abs(np.abs(r.values) - 2.0**60) < 2.0**10)


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1e6), st.floats(1e-3, 10.0), st.integers(1, 5000))
def test_scale_previews_equal_the_release(sens: float, p: float, n: int) -> None:
    # noise_scale() before a publish must be the scale the publish then uses, grid included.
    x = np.zeros(n)
    assert laplace_scale(sensitivity_l1=sens, epsilon=p, count=n) == (
        laplace(x, sensitivity_l1=sens, epsilon=p).scale
    )
    assert gaussian_scale(sensitivity_l2=sens, rho=p, count=n) == (
        gaussian(x, sensitivity_l2=sens, rho=p).scale
    )
    assert laplace_scale(sensitivity_l1=0.0, epsilon=p, count=n) == 0.0


@settings(max_examples=80, deadline=None)
@given(st.floats(1e-6, 1e7), st.floats(1e-3, 10.0), st.integers(1, 5000))
def test_integer_plans_noise_on_the_integers_or_exactly_as_before(
    sens: float, p: float, n: int
) -> None:
    # integers whose change is at most sens: the grid 1 without rounding term where the fine
    # grid is no coarser and the sampler takes the scale; else the fine grid, bit for bit
    laplace_plans = (
        plan_laplace(sensitivity_l1=sens, epsilon=p, count=n, integral=True),
        plan_laplace(sensitivity_l1=sens, epsilon=p, count=n),
        laplace_scale(sensitivity_l1=sens, epsilon=p, count=n, integral=True),
    )
    gaussian_plans = (
        plan_gaussian(sensitivity_l2=sens, rho=p, count=n, integral=True),
        plan_gaussian(sensitivity_l2=sens, rho=p, count=n),
        gaussian_scale(sensitivity_l2=sens, rho=p, count=n, integral=True),
    )
    for norm, (planned, fine, preview) in ((1, laplace_plans), (2, gaussian_plans)):
        whole = math.floor(Fraction(sens) ** norm)  # the integer query's L1 or squared L2
        assert preview == planned.scale
        assert (planned.epsilon, planned.rho) == (fine.epsilon, fine.rho)
        # the integer scale: whole / epsilon, or sqrt(whole) / sqrt(2 rho), about
        ideal = whole / p if norm == 1 else math.sqrt(whole / (2 * p))
        assert fine.grid_exponent is not None
        if whole >= 1 and fine.grid_exponent <= 0 and ideal < MAX_SCALE * (1 - 1e-9):
            assert planned.grid_exponent == 0
            assert planned.scale <= fine.scale and planned.sensitivity <= fine.sensitivity
            assert Fraction(planned.sensitivity) ** norm >= whole
            if norm == 1:
                assert Fraction(planned.scale) * Fraction(p) >= whole
                assert planned.scale == pytest.approx(ideal, rel=1e-15)
            else:
                d2 = Fraction(planned.sensitivity) ** 2
                assert d2 <= 2 * Fraction(p) * Fraction(planned.scale) ** 2
                assert planned.scale == pytest.approx(ideal, rel=1e-14)
        elif whole == 0 or fine.grid_exponent > 0 or ideal > MAX_SCALE * (1 + 1e-9):
            assert (planned.grid_exponent, planned.scale, planned.sensitivity) == (
                fine.grid_exponent,
                fine.scale,
                fine.sensitivity,
            )
