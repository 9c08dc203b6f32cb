"""Privacy accounting: zCDP composition and conversion, calibration, and a privacy filter.

All pure functions on floats; storage (the ledger) lives elsewhere.

A release charges a :class:`Charge`: a pure ``epsilon`` (Laplace), a zCDP ``rho`` (Gaussian) and
the sampler's deviation ``tv`` (see :mod:`dpnode.core.dp.samplers`). What that costs the filter is
worked out for each release *at its own parameters* (:func:`release_terms`), never at the
budget's: the result does not depend on how large a budget is.

* A Laplace release of epsilon ``ε`` whose noise is within total variation ``tv`` of the ideal
  is ``(ε, (1 + e^ε) tv)``-DP (:func:`laplace_sampler_delta`).
* A Gaussian release of rho ``ρ`` on ``n`` values is, up to an event of probability ``δ``, a
  ``(ρ, ξ)``-zCDP one at every order the filter uses (:func:`gaussian_sampler_terms`): ``ξ`` is
  charged as pure epsilon and ``δ`` as delta. Its ``tv`` is ``n`` times the fixed
  :data:`GAUSSIAN_TV`, which is how ``n`` is known.

The filter (:func:`fits`) decides whether a new charge keeps a user within a budget
``(epsilon, delta)`` under *fully adaptive* composition, where each charge may depend on earlier
results. Adding up epsilons and converting the rho total with the best Rényi order chosen after
the fact is **not** sound under full adaptivity (the order, and the split between the two kinds,
would depend on the outputs). With the terms ``(ε_i, ρ_i, δ_i)`` of each release:

* ``E = Σ ε_i``, ``R = Σ ρ_i``, ``D = Σ δ_i`` over the history and the new charge;
* ``D <= delta_B / 1024`` (:data:`SAMPLER_DELTA_SHARE`);
* if ``R = 0``: ``E <= epsilon_B``; otherwise ``E + max(0, min over α in ORDERS of [α R +
  c_α]) <= epsilon_B``, with ``δ_z = delta_B (1 - 1/1024)``, ``K = |ORDERS|`` and
  ``c_α = (log(K / δ_z) - log α) / (α - 1) + log(1 - 1/α)``.

Why it holds: each release splits, for any two neighbouring datasets and any history, into a
good part of weight ``1 - δ_i`` (the same on both) and a rest. On the good parts the Laplace
steps lose at most ``ε_i``, and for a fixed order α the process ``exp((α-1)(L - E - α R))``
over the privacy loss ``L`` is a non-negative supermartingale, so its expectation at the
stopping time is at most 1, whatever the stopping rule. Where the filter stopped, some order
has ``E + α R + c_α <= epsilon_B``, and ``(1 - e^(-y))_+ <= κ_α e^((α-1) y)`` with ``κ_α =
(1 - 1/α)^(α-1) / α``; summing over the fixed, finite set of orders bounds the hockey-stick
divergence at ``epsilon_B`` by ``Σ κ_α e^(-(α-1) c_α) = δ_z``, and leaving the good parts
costs at most ``D``. This is the Rényi filter of Feldman & Zrnic (2021) read through Whitehouse,
Ramdas, Rogers & Wu (2023), with pure epsilons added as in Rogers, Roth, Ullman & Vadhan (2016)
and the conversion of Canonne, Kamath & Steinke (2020, Proposition 12) at each order (about 12%
less epsilon than Markov's ``log(K / δ_z) / (α - 1)`` near epsilon 1). The full argument, with
its lemmas, is in ``docs/privacy.md`` ("The filter").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "DELTA_PRICE",
    "GAUSSIAN_BULKS",
    "GAUSSIAN_ERROR",
    "GAUSSIAN_GAMMA",
    "GAUSSIAN_TV",
    "ORDERS",
    "SAMPLER_DELTA_SHARE",
    "Charge",
    "Terms",
    "calibrate_rho",
    "compose",
    "fits",
    "gaussian_count",
    "gaussian_sampler_bound",
    "gaussian_sampler_terms",
    "gaussian_sigma",
    "laplace_sampler_delta",
    "pure_to_zcdp",
    "release_terms",
    "spent",
    "zcdp_delta",
    "zcdp_to_dp",
    "zcdp_to_dp_cks",
]

#: Rényi orders the filter may use: α - 1 = 2^j for j in -4 .. 16.
ORDERS: tuple[float, ...] = tuple(1.0 + 2.0**j for j in range(-4, 17))
#: Share of a budget's delta left for deltas charged directly (the samplers'), the rest
#: converting the rho total.
SAMPLER_DELTA_SHARE = 1.0 / 1024

#: The total-variation bound a Gaussian plan reports per value: above every plan's (checked
#: when the plan is built), and the same for all, so that a release's ``tv`` is ``n`` times it.
GAUSSIAN_TV = 2.0**-96
#: Every Gaussian plan's noise pmf ``q`` satisfies ``|q(z) - p(z)| <= GAUSSIAN_GAMMA p(z) +
#: GAUSSIAN_ERROR p(0)`` for every integer ``z``, ``p`` the ideal discrete Gaussian (checked
#: when the plan is built; the largest plans reach about 2^-112.2 and 2^-125).
GAUSSIAN_GAMMA = 2.0**-120
GAUSSIAN_ERROR = 2.0**-111
#: α / (α - 1) at the smallest order of :data:`ORDERS`: what conditioning on the good event
#: costs each order, per unit of log-probability.
_CONDITIONING = ORDERS[0] / (ORDERS[0] - 1)
#: Relative margin for the float arithmetic of the per-release terms (rounded up with it).
_MARGIN = 1.0 + 1e-9


@dataclass(frozen=True)
class Charge:
    """What one release costs.

    Attributes:
        epsilon: pure-DP epsilon (Laplace), 0 if none.
        rho: zCDP rho (Gaussian), 0 if none.
        tv: total-variation distance of the release's noise from the ideal, upper bound. For
            a Gaussian release it is ``n`` times :data:`GAUSSIAN_TV`, ``n`` the values noised.
    """

    epsilon: float = 0.0
    rho: float = 0.0
    tv: float = 0.0

    def __post_init__(self) -> None:
        for name in ("epsilon", "rho", "tv"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class Terms:
    """What one release costs the filter, at its own parameters (:func:`release_terms`).

    Attributes:
        epsilon: pure epsilon: a Laplace release's, or a Gaussian sampler's ``ξ``.
        rho: zCDP rho (a Gaussian release's).
        delta: the sampler's delta (``inf`` when no delta below 1 covers it).
    """

    epsilon: float = 0.0
    rho: float = 0.0
    delta: float = 0.0


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
        if mid in (lo, hi):  # converged: further rounds change nothing
            break
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
        if mid in (lo, hi):  # converged: further rounds change nothing
            break
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
        if mid in (lo, hi):  # converged: further rounds change nothing
            break
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


def laplace_sampler_delta(epsilon: float, tv: float) -> float:
    """The delta a Laplace release's sampler costs: ``(1 + e^epsilon) tv``, rounded up.

    A mechanism within total variation ``tv`` of an epsilon-DP one is ``(epsilon, (1 +
    e^epsilon) tv)``-DP. ``inf`` where that is 1 or more (no budget covers it).

    >>> laplace_sampler_delta(1.0, 1e-30) > 3.718e-30, laplace_sampler_delta(800.0, 1e-30)
    (True, inf)
    """
    if tv == 0:
        return 0.0
    log_delta = math.log(tv) + epsilon + math.log1p(math.exp(-epsilon))
    if log_delta >= 0:
        return math.inf
    return min(1.0, math.exp(log_delta) * _MARGIN)


def gaussian_count(tv: float) -> int:
    """How many values a Gaussian release of deviation ``tv`` noised (``tv = n GAUSSIAN_TV``).

    The largest ``n`` with ``n GAUSSIAN_TV <= tv``, and at least 1 for any ``tv > 0``: an upper
    bound on the count whatever ``tv`` says.

    >>> gaussian_count(0.0), gaussian_count(21 * GAUSSIAN_TV), gaussian_count(1e-40)
    (0, 21, 1)
    """
    if tv == 0:
        return 0
    return max(1, math.floor(tv / GAUSSIAN_TV))


def _bulk_tail(bulk: float) -> float:
    # The ideal mass beyond the bulk {z : p(z) >= bulk p(0)}, at most, whatever the scale
    # (docs/privacy.md, Lemma 4): 2 bulk / (1 - e^-1) covers every s.
    return 3.17 * bulk


def _shifted_tail(tail: float, rho: float, n: float) -> float:
    """``min over α > 1 of tail^(1 - 1/α) (n - 1 + e^((α-1) rho))``: how likely an output
    leaves the bulk around the neighbour's values (Rényi probability preservation, per value,
    with the rhos of the values summing to at most ``rho``)."""
    log_tail = math.log(tail)

    def log_bound(t: float) -> float:  # t = log(α - 1)
        a1 = math.exp(t)
        grow = a1 * rho
        if grow > 700:
            return math.inf
        return (a1 / (1.0 + a1)) * log_tail + math.log(n - 1.0 + math.exp(grow))

    # Any α gives a valid bound: a golden-section search on log(α - 1) finds a good one.
    lo, hi = -20.0, 20.0
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(48):
        left, right = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if log_bound(left) <= log_bound(right):
            hi = right
        else:
            lo = left
    best = min(log_bound(lo), log_bound(hi), log_bound((lo + hi) / 2.0))
    return math.inf if best >= 0 else math.exp(best)


def _gaussian_terms_at(rho: float, n: float, bulk: float) -> tuple[float, float]:
    """``(ξ, δ)`` of Theorem 2 (docs/privacy.md) for the bulk ``{z : p(z) >= bulk p(0)}``."""
    tail = _bulk_tail(bulk)
    delta = n * (tail + 2 * GAUSSIAN_TV) + _shifted_tail(tail, rho, n)
    delta *= _MARGIN
    if not delta < 1:
        return math.inf, math.inf
    g = GAUSSIAN_GAMMA + GAUSSIAN_ERROR / bulk
    per_value = _CONDITIONING * math.log1p(g) - math.log1p(-g)
    xi = (n * per_value - _CONDITIONING * math.log1p(-delta)) * _MARGIN
    return xi, delta


#: The bulks a Gaussian release may be analysed with: ``p(z) >= 2^-b p(0)``, b = 56 .. 104.
GAUSSIAN_BULKS: tuple[float, ...] = tuple(2.0**-b for b in range(56, 105, 2))
#: Epsilon one unit of delta is worth when choosing among them: a default budget's ratio of
#: epsilon (10) to the delta left for direct charges (about 1e-9).
DELTA_PRICE = 1e10


@lru_cache(maxsize=1024)
def gaussian_sampler_terms(rho: float, count: int) -> tuple[float, float]:
    """``(ξ, δ)``: a Gaussian release of ``rho`` on ``count`` values, as its sampler draws it.

    For any two neighbouring datasets both output laws split as ``(1 - δ) A + δ B`` with
    ``D_α(A || A') <= α rho + ξ`` at every order of :data:`ORDERS` (``docs/privacy.md``, "The
    samplers' deviation and the budget", Theorem 2). With ``n = count``, a bulk ``θ`` of
    :data:`GAUSSIAN_BULKS`, ``τ = 3.17 θ`` and ``γ = GAUSSIAN_GAMMA + GAUSSIAN_ERROR / θ``:

    * ``δ = n (τ + 2 GAUSSIAN_TV) + min over α > 1 of τ^(1 - 1/α) (n - 1 + e^((α-1) rho))``;
    * ``ξ = n (17 log(1 + γ) + log(1 / (1 - γ))) + 17 log(1 / (1 - δ))``;

    the bulk being the one that minimises ``ξ + DELTA_PRICE δ`` (public quantities only; any
    bulk is sound). Both are rounded up (a relative margin for the float arithmetic), and are
    ``inf`` when no bulk gives a delta below 1.

    Raises:
        ValueError: on a negative or non-finite rho, or a negative count.

    >>> xi, delta = gaussian_sampler_terms(0.5, 1)
    >>> f"{xi:.3e} {delta:.3e}"
    '2.095e-09 1.867e-19'
    """
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be finite and >= 0, got {rho!r}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count!r}")
    if count == 0:
        return 0.0, 0.0
    n = float(count)
    best = (math.inf, math.inf)
    for bulk in GAUSSIAN_BULKS:
        xi, delta = _gaussian_terms_at(rho, n, bulk)
        if xi + DELTA_PRICE * delta < best[0] + DELTA_PRICE * best[1]:
            best = (xi, delta)
    return best


def gaussian_sampler_bound(rho: float, count: int, releases: int) -> tuple[float, float]:
    """``(ξ, δ)`` covering ``releases`` Gaussian releases, each of rho at most ``rho`` on at
    most ``count`` values, whose parameters are chosen adaptively (AIM's rounds).

    Every release is analysed at one bulk, the one :func:`gaussian_sampler_terms` picks for
    ``(rho, count)`` (any bulk is sound); at a fixed bulk both terms grow with the rho and the
    count, so each release's pair is at most this bulk's pair at ``(rho, count)``, and
    ``releases`` of them at most that many times it.

    >>> one = gaussian_sampler_terms(0.5, 10)
    >>> xi, delta = gaussian_sampler_bound(0.5, 10, 3)
    >>> xi > 3 * one[0] and delta > 3 * one[1]
    True
    """
    if releases <= 0 or count <= 0:
        return 0.0, 0.0
    xi, delta = gaussian_sampler_terms(rho, count)
    return xi * releases * _MARGIN, delta * releases * _MARGIN


def release_terms(charge: Charge) -> Terms:
    """What ``charge`` (one release) costs the filter, at the release's own parameters.

    A charge with a rho is a Gaussian release (its ``tv`` says how many values it noised);
    otherwise a Laplace one.

    >>> release_terms(Charge(epsilon=0.5))
    Terms(epsilon=0.5, rho=0.0, delta=0.0)
    >>> t = release_terms(Charge(rho=0.5, tv=GAUSSIAN_TV))
    >>> t.rho, t.epsilon > 0, t.delta > 0
    (0.5, True, True)
    """
    if charge.rho > 0:
        xi, delta = gaussian_sampler_terms(charge.rho, gaussian_count(charge.tv))
        return Terms(charge.epsilon + xi, charge.rho, delta)
    return Terms(charge.epsilon, 0.0, laplace_sampler_delta(charge.epsilon, charge.tv))


def _zcdp_filter_epsilon(rho: float, delta_z: float) -> float:
    """``max(0, min over α of α rho + c_α)`` (module docstring); 0 for no rho."""
    if rho == 0:
        return 0.0
    log_term = math.log(len(ORDERS) / delta_z)
    return max(
        0.0, min(a * rho + (log_term - math.log(a)) / (a - 1) + math.log1p(-1 / a) for a in ORDERS)
    )


def _totals(charges: Iterable[Charge]) -> Terms:
    terms = [release_terms(c) for c in charges]
    return Terms(
        epsilon=math.fsum(t.epsilon for t in terms),
        rho=math.fsum(t.rho for t in terms),
        delta=math.fsum(t.delta for t in terms),
    )


def spent(charges: Iterable[Charge], *, epsilon: float, delta: float) -> tuple[float, float]:
    """The (epsilon, delta) a history of charges has used of a budget, as the filter counts it.

    The delta is the samplers' deltas plus, once any rho was charged, the share ``δ_z`` the
    rho total is converted at. Each charge is one release.

    Args:
        charges: the history.
        epsilon: the budget's epsilon (only checked: nothing depends on it).
        delta: the budget's delta, in [0, 1).

    Raises:
        ValueError: on an invalid budget.

    >>> spent([Charge(epsilon=0.5), Charge(epsilon=0.25)], epsilon=1.0, delta=1e-6)
    (0.75, 0.0)
    """
    _check_budget(epsilon, delta)
    total = _totals(charges)
    if total.rho == 0:
        return total.epsilon, total.delta
    if delta == 0:
        return math.inf, math.inf
    delta_z = delta * (1.0 - SAMPLER_DELTA_SHARE)
    return total.epsilon + _zcdp_filter_epsilon(total.rho, delta_z), delta_z + total.delta


def _check_budget(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ValueError(f"budget epsilon must be finite and >= 0, got {epsilon!r}")
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"budget delta must be in [0, 1), got {delta!r}")


def fits(history: Iterable[Charge], new: Charge, *, epsilon: float, delta: float) -> bool:
    """Whether ``new`` may be released after ``history`` within the budget (a privacy filter).

    Sound under fully adaptive composition (see the module docstring); each charge is one
    release, costed at its own parameters, so any budget epsilon works the same way. A budget
    with ``delta == 0`` admits nothing with a sampler deviation or a rho.

    Args:
        history: charges already made, one per release.
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
    >>> fits([], Charge(epsilon=0.5, tv=1e-30), epsilon=10_000.0, delta=1e-6)
    True
    """
    _check_budget(epsilon, delta)
    total = _totals([*history, new])
    if not total.delta <= delta * SAMPLER_DELTA_SHARE:
        return False
    if total.rho == 0:
        return total.epsilon <= epsilon
    if delta == 0:
        return False
    delta_z = delta * (1.0 - SAMPLER_DELTA_SHARE)
    return total.epsilon + _zcdp_filter_epsilon(total.rho, delta_z) <= epsilon
