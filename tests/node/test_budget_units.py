"""A sampler's deviation is costed in ledger units exactly as the formulas say, at the
release's own parameters."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpnode import policies
from dpnode.core.dp import accounting
from dpnode.core.errors import InvalidRequestError
from dpnode.node.services.costs import (
    DELTA_UNIT,
    EPSILON_UNIT,
    RHO_UNIT,
    TV_UNIT,
    Cost,
    _tv_delta_units,
    gaussian_count,
    quantize_epsilon,
    sampler_units,
    units_up,
)

WHOLE = 10**18  # a delta of 1, in units: no budget has it


def _reference(tv_units: int, epsilon_units: int) -> int:
    """``ceil((1 + e^epsilon) tv)`` in delta units, in Fractions, e^epsilon rounded up."""
    if tv_units == 0:
        return 0
    epsilon = float(epsilon_units * EPSILON_UNIT)
    if epsilon > 700:
        return WHOLE
    factor = Fraction(math.nextafter(math.exp(math.nextafter(epsilon, math.inf)), math.inf))
    return min(WHOLE, math.ceil((1 + factor) * tv_units * TV_UNIT / DELTA_UNIT))


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
    # e^0 is taken as the float above 1, so 10**22 tv units (1e-18) at epsilon 0 are just
    # over 2 delta units: 3; no deviation costs nothing.
    assert _tv_delta_units(10**22, 0) == 3
    assert _tv_delta_units(0, 10**9) == 0


def test_a_laplace_release_pays_at_its_own_epsilon() -> None:
    # One value at scale 20 grid units: the tables' deviation is about 5e-36. At epsilon 50
    # that is (1 + e^50) 5e-36, about 3e-14: affordable, whatever the allocation.
    tv = units_up(5.4e-36, TV_UNIT, "tv")
    epsilon, delta = sampler_units(Cost("laplace", 50 * 10**9, tv_units=tv))
    assert epsilon == 0 and 2.7e-14 < delta * DELTA_UNIT < 2.9e-14
    # At epsilon 0.1 the same deviation costs one unit (1e-18), the least a charge can be.
    assert sampler_units(Cost("laplace", 10**8, tv_units=tv)) == (0, 1)


def test_the_count_of_a_gaussian_release_is_read_back_exactly() -> None:
    for n in (1, 2, 21, 1000, 10**6, 10**9, 2**40 + 3):
        assert gaussian_count(units_up(n * accounting.GAUSSIAN_TV, TV_UNIT, "tv")) == n
    assert gaussian_count(0) == 0 and gaussian_count(1) == 1  # any deviation: one value at least


def test_a_gaussian_release_pays_the_accounting_terms_rounded_up() -> None:
    for n, rho_units in ((1, 5 * 10**8), (21, 24_355_971), (10**6, 1_539_278_764)):
        tv = units_up(n * accounting.GAUSSIAN_TV, TV_UNIT, "tv")
        rho = float(rho_units * RHO_UNIT)
        if Fraction(rho) < rho_units * RHO_UNIT:  # rounded up, as the node does
            rho = math.nextafter(rho, math.inf)
        xi, delta = accounting.gaussian_sampler_terms(rho, n)
        assert sampler_units(Cost("gaussian", rho_units=rho_units, tv_units=tv)) == (
            math.ceil(Fraction(xi) / EPSILON_UNIT),
            math.ceil(Fraction(delta) / DELTA_UNIT),
        )
    # A rho the samplers' precision cannot certify costs a whole delta: no budget fits it.
    tv = units_up(accounting.GAUSSIAN_TV, TV_UNIT, "tv")
    assert sampler_units(Cost("gaussian", rho_units=500 * 10**9, tv_units=tv))[1] == WHOLE


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_in_float_is_the_fractions_float(units: int) -> None:
    for unit in (EPSILON_UNIT, DELTA_UNIT, TV_UNIT):
        assert policies.in_float(units, unit) == float(units * unit)


def test_quantize_epsilon_refuses_a_flag_even_after_the_number() -> None:
    assert quantize_epsilon(1.0) == 1
    with pytest.raises(InvalidRequestError):
        quantize_epsilon(True)
