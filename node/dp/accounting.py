"""Privacy accounting: zCDP composition and conversion, calibration, and a privacy filter.

All pure functions on floats; storage (the ledger) lives elsewhere.

A release charges a :class:`Charge`: a pure ``epsilon`` (Laplace), a zCDP ``rho`` (Gaussian) and
the sampler's total-variation deviation ``tv`` (see :mod:`node.dp.samplers`).

The filter (:func:`fits`) decides whether a new charge keeps a user within a budget
``(epsilon, delta)`` under *fully adaptive* composition, where each charge may depend on earlier
results. Adding up epsilons and converting the rho total with the best Rényi order chosen after
the fact is **not** sound under full adaptivity (the order, and the split between the two kinds,
would depend on the outputs). The rule here is:

* ``E = Σ epsilon``, ``R = Σ rho``, ``H = Σ tv`` over the history and the new charge;
* ``(1 + e^epsilon_B) H <= delta_B / 1024`` (sampler deviations; Balle–Barthe–Gaboardi style
  coupling: a mechanism within TV ``η`` of an ``(ε, δ)``-DP one is ``(ε, δ + (1 + e^ε) η)``-DP);
* if ``R = 0``: ``E <= epsilon_B``; otherwise ``E + min over α in ORDERS of
  [α R + log(|ORDERS| / δ_z) / (α - 1)] <= epsilon_B`` with ``δ_z = delta_B (1 - 1/1024)``.

Why it holds: for a fixed order α the process ``exp((α-1)(Σ L_i - α Σ rho_i))`` over the
Gaussian steps' privacy losses ``L_i`` is a supermartingale (each step is ``rho_i``-zCDP given
the past), so by Ville's inequality its running maximum exceeds ``|ORDERS|/δ_z`` with probability
at most ``δ_z/|ORDERS|``, whatever the stopping rule; a union bound over the fixed, finite set of
orders and the pure steps' bounded losses ``L_j <= epsilon_j`` give a total loss above
``epsilon_B`` with probability at most ``δ_z``. This is the Rényi filter of Feldman & Zrnic
(2021) read through Whitehouse, Ramdas, Rogers & Wu (2023), with the Bun & Steinke (2016)
conversion, and pure epsilons add as in Rogers, Roth, Ullman & Vadhan (2016).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "ORDERS",
    "SAMPLER_DELTA_SHARE",
    "Charge",
    "calibrate_rho",
    "compose",
    "fits",
    "gaussian_sigma",
    "pure_to_zcdp",
    "spent",
    "zcdp_delta",
    "zcdp_to_dp",
    "zcdp_to_dp_cks",
]

#: Rényi orders the filter may use: α - 1 = 2^j for j in -4 .. 16.
ORDERS: tuple[float, ...] = tuple(1.0 + 2.0**j for j in range(-4, 17))
#: Share of a budget's delta reserved for the samplers' total-variation deviation.
SAMPLER_DELTA_SHARE = 1.0 / 1024


@dataclass(frozen=True)
class Charge:
    """What one release costs.

    Attributes:
        epsilon: pure-DP epsilon (Laplace), 0 if none.
        rho: zCDP rho (Gaussian), 0 if none.
        tv: total-variation distance of the release's noise from the ideal, upper bound.
    """

    epsilon: float = 0.0
    rho: float = 0.0
    tv: float = 0.0

    def __post_init__(self) -> None:
        for name in ("epsilon", "rho", "tv"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def compose(charges: Iterable[Charge]) -> Charge:
    """Sum charges: pure epsilons add, zCDP rhos add (Bun & Steinke 2016, Lemma 2.3), TVs add.

    >>> compose([Charge(epsilon=0.5), Charge(rho=0.1, tv=1e-30), Charge(rho=0.2)])
    Charge(epsilon=0.5, rho=0.30000000000000004, tv=1e-30)
    """
    items = list(charges)
    return Charge(
        epsilon=math.fsum(c.epsilon for c in items),
        rho=math.fsum(c.rho for c in items),
        tv=math.fsum(c.tv for c in items),
    )


def pure_to_zcdp(epsilon: float) -> float:
    """An epsilon-DP mechanism is (epsilon²/2)-zCDP (Bun & Steinke 2016, Proposition 1.4).

    >>> pure_to_zcdp(1.0)
    0.5
    """
    return epsilon * epsilon / 2.0


def _check_delta(delta: float) -> None:
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def zcdp_to_dp(rho: float, *, delta: float) -> float:
    """rho-zCDP implies (epsilon, delta)-DP with epsilon = rho + 2 sqrt(rho log(1/delta)).

    Bun & Steinke 2016, Proposition 1.3.

    Args:
        rho: zCDP parameter, >= 0.
        delta: in (0, 1).

    Raises:
        ValueError: on a delta outside (0, 1) or a negative rho.

    >>> round(zcdp_to_dp(0.5, delta=1e-6), 6)
    5.756522
    """
    _check_delta(delta)
    if rho < 0:
        raise ValueError("rho must be >= 0")
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _cks_log_delta(rho: float, epsilon: float, alpha: float) -> float:
    # Canonne, Kamath & Steinke 2020, Proposition 12 applied to rho-zCDP (Corollary 13):
    # delta = exp((α-1)(αρ - ε)) / (α-1) * (1 - 1/α)^α for any α > 1.
    return (
        (alpha - 1) * (alpha * rho - epsilon) + alpha * math.log1p(-1 / alpha) - math.log(alpha - 1)
    )


def zcdp_delta(rho: float, *, epsilon: float) -> float:
    """Smallest delta (up to the search) such that rho-zCDP implies (epsilon, delta)-DP.

    Canonne, Kamath & Steinke 2020, Corollary 13; any order α > 1 gives a valid bound, so an
    imprecise search only errs upwards.

    >>> f"{zcdp_delta(0.025, epsilon=1.0):.4e}"
    '1.3361e-06'
    """
    if rho < 0 or epsilon < 0:
        raise ValueError("rho and epsilon must be >= 0")
    if rho == 0:
        return 0.0
    # The exponent is convex in α with derivative (2α - 1)ρ - ε + log(1 - 1/α), increasing
    # from -inf at α = 1: bisect for its root on log(α - 1).
    lo, hi = math.log(1e-9), math.log(2.0 + (epsilon + 1.0) / rho)
    for _ in range(100):
        mid = (lo + hi) / 2
        alpha = 1.0 + math.exp(mid)
        if (2 * alpha - 1) * rho - epsilon + math.log1p(-1 / alpha) < 0:
            lo = mid
        else:
            hi = mid
    return min(1.0, math.exp(_cks_log_delta(rho, epsilon, 1.0 + math.exp(hi))))


def zcdp_to_dp_cks(rho: float, *, delta: float) -> float:
    """rho-zCDP implies (epsilon, delta)-DP for this epsilon (CKS 2020, Corollary 13).

    Tighter than :func:`zcdp_to_dp`; valid for a *fixed* rho (not for a filter's running total).
    The search returns an epsilon at which :func:`zcdp_delta` is at most ``delta``.

    >>> round(zcdp_to_dp_cks(0.5, delta=1e-6), 4)
    5.2215
    """
    _check_delta(delta)
    if rho < 0:
        raise ValueError("rho must be >= 0")
    if rho == 0:
        return 0.0
    lo, hi = 0.0, zcdp_to_dp(rho, delta=delta)
    for _ in range(100):
        mid = (lo + hi) / 2
        if zcdp_delta(rho, epsilon=mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


@lru_cache(maxsize=256)
def calibrate_rho(epsilon: float, delta: float) -> float:
    """Largest rho (up to the search) such that rho-zCDP implies (epsilon, delta)-DP (CKS).

    Args:
        epsilon: target epsilon, finite and > 0.
        delta: target delta, in (0, 1).

    Raises:
        ValueError: on invalid targets.

    >>> round(calibrate_rho(1.0, 1e-6), 6)
    0.024356
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    _check_delta(delta)
    lo, hi = 0.0, epsilon + 1.0  # zcdp_delta(eps + 1, eps) > delta for delta < 1
    for _ in range(100):
        mid = (lo + hi) / 2
        if zcdp_delta(mid, epsilon=epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def gaussian_sigma(sensitivity_l2: float, *, epsilon: float, delta: float) -> float:
    """Noise parameter sigma of a Gaussian mechanism that is (epsilon, delta)-DP via zCDP.

    sigma = Δ₂ / sqrt(2 rho) with rho from :func:`calibrate_rho` (the discrete Gaussian is
    Δ₂²/(2σ²)-zCDP: Canonne, Kamath & Steinke 2020, Theorem 14).

    >>> round(gaussian_sigma(1.0, epsilon=1.0, delta=1e-6), 4)
    4.5309
    """
    if not (math.isfinite(sensitivity_l2) and sensitivity_l2 >= 0):
        raise ValueError("sensitivity must be finite and >= 0")
    return sensitivity_l2 / math.sqrt(2.0 * calibrate_rho(epsilon, delta))


def _zcdp_filter_epsilon(rho: float, delta_z: float) -> float:
    if rho == 0:
        return 0.0
    log_term = math.log(len(ORDERS) / delta_z)
    return min(a * rho + log_term / (a - 1) for a in ORDERS)


def spent(charges: Iterable[Charge], *, epsilon: float, delta: float) -> tuple[float, float]:
    """The (epsilon, delta) a history of charges has used of a budget, as the filter counts it.

    Args:
        charges: the history.
        epsilon: the budget's epsilon (its delta share for samplers scales with e^epsilon).
        delta: the budget's delta, in [0, 1).

    Raises:
        ValueError: on an invalid budget.

    >>> spent([Charge(epsilon=0.5), Charge(epsilon=0.25)], epsilon=1.0, delta=1e-6)
    (0.75, 0.0)
    """
    _check_budget(epsilon, delta)
    total = compose(charges)
    tv_delta = (1.0 + math.exp(epsilon)) * total.tv
    if total.rho == 0:
        return total.epsilon, tv_delta
    if delta == 0:
        return math.inf, math.inf
    delta_z = delta * (1.0 - SAMPLER_DELTA_SHARE)
    return total.epsilon + _zcdp_filter_epsilon(total.rho, delta_z), delta_z + tv_delta


def _check_budget(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and 0.0 <= epsilon <= 700.0):
        raise ValueError(f"budget epsilon must be in [0, 700], got {epsilon!r}")
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"budget delta must be in [0, 1), got {delta!r}")


def fits(history: Iterable[Charge], new: Charge, *, epsilon: float, delta: float) -> bool:
    """Whether ``new`` may be released after ``history`` within the budget (a privacy filter).

    Sound under fully adaptive composition (see the module docstring). A budget with
    ``delta == 0`` admits nothing with a sampler deviation or a rho.

    Args:
        history: charges already made.
        new: the charge asked for.
        epsilon: the budget's epsilon.
        delta: the budget's delta.

    Raises:
        ValueError: on an invalid budget.

    >>> budget = dict(epsilon=1.0, delta=1e-6)
    >>> fits([Charge(epsilon=0.6, tv=1e-30)], Charge(epsilon=0.4, tv=1e-30), **budget)
    True
    >>> fits([Charge(epsilon=0.6)], Charge(epsilon=0.41), **budget)
    False
    """
    _check_budget(epsilon, delta)
    total = compose([*history, new])
    if (1.0 + math.exp(epsilon)) * total.tv > delta * SAMPLER_DELTA_SHARE:
        return False
    if total.rho == 0:
        return total.epsilon <= epsilon
    if delta == 0:
        return False
    delta_z = delta * (1.0 - SAMPLER_DELTA_SHARE)
    return total.epsilon + _zcdp_filter_epsilon(total.rho, delta_z) <= epsilon
