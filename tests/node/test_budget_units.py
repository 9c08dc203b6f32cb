"""A sampler's deviation is converted to delta units exactly as the Fraction formula says."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from node.services.budget import DELTA_UNIT, EPSILON_UNIT, TV_UNIT, _tv_delta_units


def _reference(tv_units: int, epsilon_units: int) -> int:
    """``ceil((1 + e^epsilon) tv)`` in delta units, in Fractions, e^epsilon rounded up."""
    if tv_units == 0:
        return 0
    epsilon = float(epsilon_units * EPSILON_UNIT)
    if epsilon > 700:
        return tv_units * 10**40
    factor = Fraction(math.nextafter(math.exp(math.nextafter(epsilon, math.inf)), math.inf))
    return math.ceil((1 + factor) * tv_units * TV_UNIT / DELTA_UNIT)


@given(
    st.one_of(st.integers(0, 10**6), st.integers(0, 10**32), st.integers(0, 10**45)),
    st.one_of(
        st.integers(0, 10**9),
        st.integers(0, 700 * 10**9 + 10),
        st.integers(699 * 10**9, 701 * 10**9),
    ),
)
def test_the_integer_conversion_equals_the_fraction_formula(tv: int, epsilon: int) -> None:
    assert _tv_delta_units(tv, epsilon) == _reference(tv, epsilon)


def test_e_to_the_epsilon_is_rounded_up_and_so_is_the_charge() -> None:
    # e^0 is taken as the float above 1, so 10**12 tv units (1e-18) at epsilon 0 are just
    # over 2 delta units: 3; no deviation costs nothing.
    assert _tv_delta_units(10**12, 0) == 3
    assert _tv_delta_units(0, 10**9) == 0
