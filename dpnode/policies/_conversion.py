"""Converting a zCDP total (rho, from Gaussian releases) to epsilon at a fixed delta.

A budget is stated in (epsilon, delta), but Gaussian releases compose as zCDP. The check adds
the pure epsilons ``E`` and the *converted* running rho total ``R``:
``E + rho_to_epsilon(R, delta_z) <= epsilon_budget``, where ``delta_z`` is a share of the delta
budget fixed in advance by the policy (``zcdp_delta_share``).

Two conversions are provided; :func:`filter_epsilon` is the default.

* :func:`bun_steinke`: ``eps = rho + 2 sqrt(rho log(1/delta))`` (Bun & Steinke 2016,
  Proposition 1.3). It optimises the Rényi order for the final ``R``. That is exact for a rho
  fixed in advance, but under *fully adaptive* composition, where each request (and the split
  between pure and Gaussian releases) may depend on earlier results, choosing the order after
  the fact is not covered by the proof.
* :func:`filter_epsilon`: ``max(0, min over a fixed grid of orders α of α R + c_α)`` with
  ``c_α = (log(K/delta) - log α)/(α - 1) + log(1 - 1/α)`` and ``K`` orders (``α - 1 = 2^j``,
  ``j = -4 .. 16``). For each fixed α the loss process ``exp((α-1)(L - α R))`` is a
  supermartingale, so its expectation where the filter stops is at most 1 whatever the
  stopping rule; converting at each order as Canonne, Kamath & Steinke (2020, Proposition 12)
  do and summing over the K orders bounds the delta by ``delta`` (Feldman & Zrnic 2021;
  Whitehouse, Ramdas, Rogers & Wu 2023; the proof is in ``docs/privacy.md``, "The filter").
  This is the node's own filter (``dpnode.core.dp.accounting``), so a policy and the node agree on
  what is spent. It is within a few percent of Bun–Steinke for the same rho (e.g. 6.09
  against 5.76 at rho 0.5, delta 1e-6), which adaptivity does not allow.

Any function with the signature ``(rho, delta) -> epsilon`` that is non-decreasing in rho may be
passed to :func:`policies.decide` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

from dpnode.policies._units import DELTA_UNIT, EPSILON_UNIT, RHO_UNIT, units_up

__all__ = ["ORDERS", "RhoToEpsilon", "bun_steinke", "converted_units", "filter_epsilon"]

#: ``(rho, delta) -> epsilon``; must be non-decreasing in rho.
RhoToEpsilon = Callable[[float, float], float]
#: Rényi orders of the default filter: α - 1 = 2^j for j in -4 .. 16 (as ``dpnode.core.dp``).
ORDERS: tuple[float, ...] = tuple(1.0 + 2.0**j for j in range(-4, 17))


def _check(rho: float, delta: float) -> None:
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be finite and >= 0, got {rho!r}")


def bun_steinke(rho: float, delta: float) -> float:
    """rho-zCDP implies (eps, delta)-DP with ``eps = rho + 2 sqrt(rho log(1/delta))``.

    Raises:
        ValueError: on a delta outside (0, 1) or a negative rho.

    >>> round(bun_steinke(0.5, 1e-6), 6)
    5.756522
    >>> bun_steinke(0.0, 1e-6)
    0.0
    """
    _check(rho, delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def filter_epsilon(rho: float, delta: float) -> float:
    """Epsilon of a running rho total under a Rényi filter over :data:`ORDERS` (the default).

    Raises:
        ValueError: on a delta outside (0, 1) or a negative rho.

    >>> round(filter_epsilon(0.5, 1e-6), 6)
    6.089505
    >>> filter_epsilon(0.0, 1e-6)
    0.0
    """
    _check(rho, delta)
    if rho == 0:
        return 0.0
    log_term = math.log(len(ORDERS) / delta)
    return max(
        0.0, min(a * rho + (log_term - math.log(a)) / (a - 1) + math.log1p(-1 / a) for a in ORDERS)
    )


def converted_units(rho_units: int, delta_units: int, convert: RhoToEpsilon) -> int | None:
    """Epsilon units that ``rho_units`` of zCDP cost at ``delta_units``, rounded up.

    Returns 0 for no rho, and ``None`` (does not fit any budget) for a rho with no delta to
    convert at. The float arguments are rounded conservatively (rho up, delta down); a delta
    of 1 or more (grants may add up to it, and it promises nothing) converts at the largest
    float below 1.

    >>> converted_units(500_000_000, 10**12, bun_steinke)
    5756521770
    >>> converted_units(0, 0, bun_steinke), converted_units(1, 0, bun_steinke)
    (0, None)
    >>> converted_units(10**9, 3 * 10**18, bun_steinke)
    1000000030
    """
    if rho_units == 0:
        return 0
    if delta_units <= 0:
        return None
    exact_rho, exact_delta = rho_units * RHO_UNIT, delta_units * DELTA_UNIT
    rho, delta = float(exact_rho), float(exact_delta)
    if Fraction(rho) < exact_rho:
        rho = math.nextafter(rho, math.inf)
    if Fraction(delta) > exact_delta or delta >= 1.0:
        delta = math.nextafter(min(delta, 1.0), 0.0)
    return units_up(convert(rho, delta), EPSILON_UNIT, "converted epsilon")
