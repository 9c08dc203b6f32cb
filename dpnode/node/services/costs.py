"""What a release costs, in the ledger's whole units.

Amounts are kept as whole numbers of small units — epsilon and rho in 1e-9, delta in
1e-18 — so that sums are exact and a budget of 1.0 pays for exactly ten charges of 0.1. A
requested amount is rounded *down* to the unit grid before the mechanism is calibrated to
it (``quantize_epsilon``), and amounts the node derives (rho, what a sampler's deviation
costs) are rounded *up*: the charge is never less than the privacy actually spent.

A sampler's deviation is costed once, at the release's own parameters
(:func:`sampler_units`, the terms of ``dpnode.core.dp.accounting``): never at the user's
allocation or a dataset's cap, so that any allocation works alike. A Laplace release pays
``(1 + e^epsilon) tv`` as delta; a Gaussian one a delta and a small epsilon. The ledger's
``tv_units`` column holds that delta, in delta units (rows written before it did held the
raw deviation in units of 1e-30, which reading them as delta units over-counts a
trillion-fold: the safe direction).

Pure arithmetic on public quantities: nothing here reads the database.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dpnode import policies
from dpnode.core.dp import accounting
from dpnode.core.dp.mechanisms import float_at_least
from dpnode.core.errors import InvalidRequestError
from dpnode.policies import in_float

__all__ = [
    "DELTA_UNIT",
    "EPSILON_UNIT",
    "MAX_EPSILON",
    "RHO_UNIT",
    "TV_UNIT",
    "Cost",
    "check_epsilon_size",
    "delta_asked_units",
    "gaussian_count",
    "quantize_epsilon",
    "sampler_units",
    "units_down",
    "units_up",
]

EPSILON_UNIT = Fraction(1, 10**9)
RHO_UNIT = Fraction(1, 10**9)
#: Unit of the raw deviation a release reports (``Cost.tv_units``): fine enough that a release
#: of a single value at a large epsilon is not charged for rounding.
TV_UNIT = Fraction(1, 10**40)
DELTA_UNIT = Fraction(1, 10**18)


def units_down(value: float, unit: Fraction, what: str) -> int:
    """``value`` in whole units, rounded down (for amounts a person asks for or configures).

    A person's ``0.1`` means the decimal 0.1, so the shortest decimal that round-trips
    the float is used; the mechanism is then calibrated to exactly the charged amount.

    >>> units_down(0.1, EPSILON_UNIT, "epsilon"), units_down(1e-6, DELTA_UNIT, "delta")
    (100000000, 1000000000000)
    """
    return math.floor(_decimal(value, what) / unit)


def delta_asked_units(delta: float) -> int:
    """The delta a release promises, in whole units rounded up: what per-publish caps and
    approval thresholds compare (a Gaussian is calibrated to the delta asked, so one below
    the unit promises more than nothing). The decimal the person wrote, as in
    :func:`units_down`.

    >>> delta_asked_units(9e-19), delta_asked_units(3e-6)
    (1, 3000000000000)
    """
    return math.ceil(_decimal(delta, "delta") / DELTA_UNIT)


def _decimal(value: float, what: str) -> Fraction:
    _check_amount(value, what)
    return policies.decimal(value)


def units_up(value: float, unit: Fraction, what: str) -> int:
    """``value`` in whole units, rounded up (for amounts the node derives).

    >>> units_up(1e-45, TV_UNIT, "sampler deviation")
    1
    """
    _check_amount(value, what)
    return math.ceil(Fraction(value) / unit)


def _check_amount(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidRequestError(f"{what} must be a finite number >= 0, got {value!r}")


@lru_cache(maxsize=256, typed=True)  # a publish reads it thrice; typed: True is no epsilon
def quantize_epsilon(epsilon: float) -> Fraction:
    """The epsilon a mechanism is calibrated to and charged: ``epsilon`` rounded down to
    the ledger's unit, refused when nothing is left.

    >>> quantize_epsilon(0.5)
    Fraction(1, 2)
    """
    units = units_down(epsilon, EPSILON_UNIT, "epsilon")
    if units == 0:
        raise InvalidRequestError(f"epsilon must be at least 1e-9, got {epsilon!r}")
    check_epsilon_size(epsilon)
    return units * EPSILON_UNIT


#: The largest epsilon a publish, a request or a grant may name: far beyond any meaningful
#: guarantee, and small enough that ledger sums stay within a 64-bit column.
MAX_EPSILON = 1e6


def check_epsilon_size(epsilon: float, what: str = "epsilon") -> None:
    """Refuse an epsilon above :data:`MAX_EPSILON`.

    >>> check_epsilon_size(1e7)
    Traceback (most recent call last):
    ...
    dpnode.core.errors.InvalidRequestError: epsilon must be at most 1e+06, got 10000000.0
    """
    if epsilon > MAX_EPSILON:
        raise InvalidRequestError(f"{what} must be at most {MAX_EPSILON:g}, got {epsilon!r}")


@dataclass(frozen=True)
class Cost:
    """What one release costs, in ledger units, and what it asked for.

    ``asked_epsilon_units`` / ``asked_delta_units`` are the release's own guarantee, which
    per-publish caps and approval thresholds compare against (for a Laplace release the
    epsilon charged; for a Gaussian one the (epsilon, delta) it was calibrated to, while
    ``rho_units`` is what is charged). ``tv_units`` is the noise's raw deviation
    (``Release.sampler_tv`` in :data:`TV_UNIT`, rounded up), which :func:`sampler_units`
    turns into what the release is charged for it. ``frame_hash`` identifies the exact
    computation, so that an approval covers that computation and no other.
    """

    mechanism: str
    epsilon_units: int = 0
    rho_units: int = 0
    tv_units: int = 0
    dataset_ids: Sequence[int] = ()
    graph_hash: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    asked_epsilon_units: int | None = None
    asked_delta_units: int = 0
    #: The hash, or a function computing it: only a policy with approval thresholds asks.
    frame_hash: str | Callable[[], str] | None = None
    #: The planned training run this publish says it is a step of (``dpnode.node.services.runs``).
    run_id: int | None = None
    #: (epsilon, delta) units charged on top of ``rho_units``, worked out by the caller for a
    #: release made of several mechanisms (a synthesis: its selections' pure epsilon and
    #: every sampler's deviation, each at its own parameters); ``None``: from ``tv_units``.
    extra_units: tuple[int, int] | None = None
    #: The computation as an admin reads it (:func:`dpnode.core.engine.listing.listing`),
    #: or a function making it: made only when the publish is queued for an approval.
    computation: list[str] | Callable[[], list[str]] | None = None
    #: What the requester says the publish is for (kept with an approval and the ledger row).
    description: str = ""
    #: Paid from the caps of the datasets it reads alone, not from the user's budget (a data
    #: owner's synthetic mock, ``dpnode.node.services.mock_synthesis``): only those caps
    #: decide (:func:`dpnode.policies.decide_cap`), and the ledger row says so.
    cap_only: bool = False

    @property
    def asked_epsilon(self) -> int:
        if self.asked_epsilon_units is not None:
            return self.asked_epsilon_units
        return self.epsilon_units


#: Raw-deviation units in one delta unit.
_TV_PER_DELTA = int(DELTA_UNIT / TV_UNIT)
#: A delta of 1 in units: more than any budget has, so a charge this large never fits.
_WHOLE_DELTA = int(1 / DELTA_UNIT)


def _tv_delta_units(tv_units: int, epsilon_units: int) -> int:
    """A Laplace release's deviation as delta, ``(1 + e^epsilon) tv`` rounded up to a delta
    unit, at the release's own ``epsilon``; at most a whole delta (which no budget has).

    A mechanism within total variation ``tv`` of an epsilon-DP one is
    (epsilon, (1 + e^epsilon) tv)-DP.

    >>> _tv_delta_units(10**10, 10**9), _tv_delta_units(10**25, 10**9)  # 1e-30, 1e-15 at 1
    (1, 3719)
    """
    if tv_units == 0:
        return 0
    epsilon = in_float(epsilon_units, EPSILON_UNIT)
    if epsilon > 700:  # e^epsilon overflows: far beyond any budget's delta
        return _WHOLE_DELTA
    factor = math.nextafter(math.exp(math.nextafter(epsilon, math.inf)), math.inf)
    # ceil((1 + p/q) tv TV_UNIT / DELTA_UNIT) in integers: exact, and a tenth of the time of
    # Fractions on every publish (tests/node/test_budget_units.py compares the two).
    p, q = factor.as_integer_ratio()
    return min(_WHOLE_DELTA, -(-(q + p) * tv_units // (q * _TV_PER_DELTA)))


def gaussian_count(tv_units: int) -> int:
    """How many values a Gaussian release noised, from its deviation: every Gaussian plan
    reports :data:`dpnode.core.dp.accounting.GAUSSIAN_TV` per value (at least 1 if ``tv_units``).

    >>> gaussian_count(units_up(21 * accounting.GAUSSIAN_TV, TV_UNIT, "tv")), gaussian_count(0)
    (21, 0)
    """
    if tv_units == 0:
        return 0
    per_value = Fraction(accounting.GAUSSIAN_TV) / TV_UNIT
    return max(1, math.floor(tv_units / per_value))


def _units_capped(value: float, unit: Fraction) -> int:
    if not value < float(_WHOLE_DELTA * DELTA_UNIT):  # inf, or a delta of 1 or more
        return math.ceil(Fraction(1) / unit)
    return units_up(value, unit, "sampler cost")


def sampler_units(cost: Cost) -> tuple[int, int]:
    """(epsilon, delta) units a release's sampler deviation costs, at its own parameters.

    A Laplace release (no rho): delta ``(1 + e^epsilon) tv`` (:func:`_tv_delta_units`). A
    Gaussian release: ``dpnode.core.dp.accounting.gaussian_sampler_terms`` for its rho and the
    number
    of values its ``tv`` says, ``ξ`` as epsilon and ``δ`` as delta. Each rounded up; a cost no
    budget could cover comes out as a whole delta (1), which no allocation holds.

    >>> sampler_units(Cost("laplace", 10**9, tv_units=10**10))
    (0, 1)
    >>> rho_half = Cost("gaussian", rho_units=5 * 10**8, tv_units=units_up(2.0**-96, TV_UNIT, "tv"))
    >>> sampler_units(rho_half)
    (3, 1)
    """
    if cost.extra_units is not None:
        return cost.extra_units
    if cost.tv_units == 0:
        return 0, 0
    if cost.rho_units == 0:
        return 0, _tv_delta_units(cost.tv_units, cost.epsilon_units)
    rho = float_at_least(cost.rho_units * RHO_UNIT)
    xi, delta = accounting.gaussian_sampler_terms(rho, gaussian_count(cost.tv_units))
    return _units_capped(xi, EPSILON_UNIT), _units_capped(delta, DELTA_UNIT)
