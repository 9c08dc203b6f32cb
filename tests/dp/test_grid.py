"""The grid: exact rounding, and the sensitivity of the rounded query is what the doc claims."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.dp.grid import FINENESS_BITS, finest_exponent, on_grid, round_to_grid, to_values
from dpnode.core.errors import EvaluationError

sensitivities = st.floats(min_value=1e-30, max_value=1e30, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(sensitivities, st.integers(min_value=1, max_value=10**9), st.sampled_from([1, 2]))
def test_finest_exponent_is_the_largest_that_fits(s: float, n: int, norm: int) -> None:
    k = finest_exponent(s, n, norm=norm)
    bound = (Fraction(s) / 2**FINENESS_BITS) ** norm / n
    assert Fraction(2) ** (norm * k) <= bound < Fraction(2) ** (norm * (k + 1))


def test_finest_exponent_refuses_bad_input() -> None:
    for s in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            finest_exponent(s, 1, norm=1)
    with pytest.raises(ValueError):
        finest_exponent(1.0, 0, norm=1)
    with pytest.raises(ValueError):
        finest_exponent(1.0, 1, norm=3)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=-1e12, max_value=1e12), min_size=1, max_size=20),
    st.integers(min_value=-60, max_value=20),
)
def test_rounding_is_exact_half_even(xs: list[float], k: int) -> None:
    idx = round_to_grid(np.array(xs), k)
    for x, i in zip(xs, idx, strict=True):
        exact = Fraction(x) / Fraction(2) ** k
        assert Fraction(float(i)) == round(exact)  # Python's round() on a Fraction: half-even
    assert on_grid(to_values(idx, k), k)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1.0, 1.0)), min_size=1, max_size=30),
    st.integers(min_value=-12, max_value=2),
)
def test_rounded_query_sensitivity_bound(pairs: list[tuple[float, float]], k: int) -> None:
    # x and x' = x + d: the rounded indices differ by at most floor(|d|_1 / 2^k) + n in L1 and
    # |d|_2 / 2^k + sqrt(n) in L2, the inflation the mechanisms charge.
    x = np.array([p[0] for p in pairs])
    x2 = x + np.array([p[1] for p in pairs])
    d = x2 - x  # the actual (float) difference
    n = x.size
    diff = np.abs(round_to_grid(x, k) - round_to_grid(x2, k))
    l1 = Fraction(float(np.abs(d).sum())) * (1 + Fraction(1, 2**40))  # fsum slack
    assert diff.sum() <= math.floor(l1 / Fraction(2) ** k) + n
    assert math.sqrt((diff**2).sum()) <= float(np.linalg.norm(d)) / 2.0**k + math.sqrt(n) + 1e-9


def test_worst_case_rounding_needs_the_extra_step() -> None:
    # 0.5 - tiny rounds down, 0.5 + tiny rounds up: a difference of 2 tiny moves one full step,
    # which is why the sensitivity of the rounded query is floor(Δ/2^k) + 1 per coordinate.
    tiny = 2.0**-30
    a = round_to_grid(np.array([0.5 - tiny]), 0)
    b = round_to_grid(np.array([0.5 + tiny]), 0)
    assert b[0] - a[0] == 1


def test_refuses_non_finite_and_overflowing_values() -> None:
    with pytest.raises(EvaluationError, match="NaN or infinite"):
        round_to_grid(np.array([1.0, np.nan]), 0)
    with pytest.raises(EvaluationError, match="NaN or infinite"):
        round_to_grid(np.array([np.inf]), 0)
    with pytest.raises(EvaluationError, match="too large for the noise grid"):
        round_to_grid(np.array([1e300]), -100)


def test_negative_zero_does_not_survive() -> None:
    out = to_values(round_to_grid(np.array([-0.1, -0.0]), 0), 0)
    assert not np.signbit(out).any()
