"""Exact privacy amounts: whole numbers of small units, as in the node's ledger.

Epsilon and rho are counted in 1e-9, delta in 1e-18 (the constants of
``dpnode.node.services.costs``, mirrored here because ``policies`` must not import the node; a test
keeps the two in step). Amounts a person configures are read as the decimal they typed (the
shortest ``repr`` of the float) and rounded *down*, so a configured cap or allocation is never
larger than written; amounts derived by arithmetic (a converted rho) are rounded *up*, so a
charge is never smaller than the privacy spent.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

__all__ = [
    "DELTA_UNIT",
    "EPSILON_UNIT",
    "RHO_UNIT",
    "decimal",
    "delta_units",
    "epsilon_units",
    "format_delta",
    "format_epsilon",
    "in_float",
    "units_down",
    "units_up",
]

EPSILON_UNIT = Fraction(1, 10**9)
RHO_UNIT = Fraction(1, 10**9)
DELTA_UNIT = Fraction(1, 10**18)


def _check(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")


@lru_cache(maxsize=256)  # the few amounts read again and again (a training run's epsilon)
def decimal(value: float) -> Fraction:
    """The decimal a person wrote as the float ``value``: its shortest ``repr``, exactly.

    >>> decimal(0.1), decimal(1e-6)
    (Fraction(1, 10), Fraction(1, 1000000))
    """
    return Fraction(Decimal(repr(float(value))))


def units_down(value: float, unit: Fraction, what: str = "amount") -> int:
    """``value`` in whole ``unit``\\ s, rounded down, reading the float as its shortest decimal.

    Raises:
        ValueError: on a negative, infinite, NaN or non-numeric value.

    >>> units_down(0.1, EPSILON_UNIT), units_down(1e-6, DELTA_UNIT)
    (100000000, 1000000000000)
    >>> units_down(1e-10, EPSILON_UNIT)
    0
    """
    _check(value, what)
    return math.floor(decimal(value) / unit)


def units_up(value: float, unit: Fraction, what: str = "amount") -> int:
    """``value`` in whole ``unit``\\ s, rounded up, reading the float exactly (binary value).

    Raises:
        ValueError: on a negative, infinite, NaN or non-numeric value.

    >>> units_up(1e-20, DELTA_UNIT), units_up(0.5, EPSILON_UNIT)
    (1, 500000000)
    """
    _check(value, what)
    return math.ceil(Fraction(value) / unit)


def epsilon_units(epsilon: float) -> int:
    """A configured epsilon (or rho) in ledger units, rounded down.

    >>> epsilon_units(2.5)
    2500000000
    """
    return units_down(epsilon, EPSILON_UNIT, "epsilon")


def delta_units(delta: float) -> int:
    """A configured delta in ledger units, rounded down.

    >>> delta_units(1e-5)
    10000000000000
    """
    return units_down(delta, DELTA_UNIT, "delta")


def in_float(units: int, unit: Fraction) -> float:
    """``units`` whole ``unit``\\ s as the nearest float: ``float(units * unit)``, without the
    Fraction (a quotient of integers is correctly rounded, as ``Fraction.__float__`` is).

    >>> in_float(1, EPSILON_UNIT), in_float(3, DELTA_UNIT) == float(3 * DELTA_UNIT)
    (1e-09, True)
    """
    return units * unit.numerator / unit.denominator


def format_epsilon(units: int) -> str:
    """Epsilon (or rho) units as a short decimal for messages.

    >>> format_epsilon(1_500_000_000), format_epsilon(1)
    ('1.5', '1e-09')
    """
    return f"{in_float(units, EPSILON_UNIT):.9g}"


def format_delta(units: int) -> str:
    """Delta units as a short decimal for messages.

    >>> format_delta(1_000_000_000_000), format_delta(0)
    ('1e-06', '0')
    """
    return f"{in_float(units, DELTA_UNIT):.6g}"
