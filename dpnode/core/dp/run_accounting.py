"""A training run's privacy filter held at one Rényi order, fixed before the run.

The budget filter (:mod:`dpnode.core.dp.accounting`) may stop at any of its 21 orders, so each
order's conversion pays ``log 21`` more than it would alone. A training run knows its shape
before it reads anything: ``steps`` Gaussian releases at one per-step rho, noising at most
``values`` values each. Fixing the order from those public values, before the first step,
removes the union: a Rényi filter at one fixed order is sound under fully adaptive
composition (Feldman & Zrnic 2021), and the conversion at that order is Canonne, Kamath &
Steinke's (2020, Proposition 12) with ``log(1 / δ)`` in place of ``log(21 / δ)``.

A run's allocation ``(epsilon, delta)`` is split like a budget: ``delta / 1024`` for its
samplers' deltas (:data:`accounting.SAMPLER_DELTA_SHARE`), the rest, ``δ_z``, for the
conversion at the order. A step fits while, over the run's steps so far and the new one,
``D = Σ δ_i <= delta / 1024`` and ``E + α R + c_α <= epsilon`` with
``c_α = (log(1 / δ_z) - log α) / (α - 1) + log(1 - 1/α)`` (:func:`run_fits`). The proof is
Theorem 4 of ``docs/privacy.md`` ("A run held at one order"): Theorem 3's with one order.

All pure functions on public floats; nothing here reads data or storage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from dpnode.core.dp.accounting import (
    GAUSSIAN_TV,
    ORDERS,
    SAMPLER_DELTA_SHARE,
    Charge,
    release_terms,
)

__all__ = [
    "MIN_ORDER",
    "RunAllocation",
    "allocate",
    "best_order",
    "conversion",
    "run_fits",
    "run_spent",
]

#: The smallest order a run may be held at: Theorem 2's sampler terms hold from 17/16 on.
MIN_ORDER = ORDERS[0]
#: The largest: beyond it the conversion's gain is nil for any rho a run could pay for.
_MAX_ORDER = ORDERS[-1]


def _check(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def conversion(order: float, rdp: float, delta: float) -> float:
    """Epsilon at ``delta`` of a mechanism whose Rényi divergence at ``order`` is ``rdp``.

    Canonne, Kamath & Steinke 2020, Proposition 12, at one order (no union over orders):
    ``rdp + (log(1 / delta) - log α) / (α - 1) + log(1 - 1/α)``, at least 0.

    Raises:
        ValueError: on an order not above 1, a negative rdp or a delta outside (0, 1).

    >>> round(conversion(8.0, 8 * 0.1, 1e-5), 6)
    2.014109
    """
    if not (math.isfinite(order) and order > 1.0):
        raise ValueError(f"order must be finite and > 1, got {order!r}")
    if not (math.isfinite(rdp) and rdp >= 0):
        raise ValueError(f"rdp must be finite and >= 0, got {rdp!r}")
    _check(1.0, delta)
    a = order
    return max(0.0, rdp + (math.log(1 / delta) - math.log(a)) / (a - 1) + math.log1p(-1 / a))


def best_order(rho: float, delta: float) -> float:
    """The order in ``[17/16, 2^16 + 1]`` minimising :func:`conversion` of ``α rho`` at ``delta``.

    Any order gives a valid bound, so the search only needs to be good, not exact: a
    golden-section search on ``log(α - 1)``, where the conversion is unimodal.

    Raises:
        ValueError: on a rho that is not finite and > 0, or a delta outside (0, 1).

    >>> round(best_order(0.1, 1e-5), 3)
    10.568
    """
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be finite and > 0, got {rho!r}")
    _check(1.0, delta)

    def cost(t: float) -> float:
        a = 1.0 + math.exp(t)
        return conversion(a, a * rho, delta)

    lo, hi = math.log(MIN_ORDER - 1), math.log(_MAX_ORDER - 1)
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(80):
        left, right = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if cost(left) <= cost(right):
            hi = right
        else:
            lo = left
    return 1.0 + math.exp((lo + hi) / 2)


@dataclass(frozen=True)
class RunAllocation:
    """A run's allocation, fixed before its first step from public values only.

    Attributes:
        epsilon: what the run may cost, in total.
        delta: the run's delta (``delta / 1024`` for its samplers, the rest converts).
        order: the Rényi order every step is accounted at.
        steps: the steps planned.
        step_rho: the zCDP rho of each planned step's Gaussian.
        values: the most values one step noises (its sampler terms depend on it).
    """

    epsilon: float
    delta: float
    order: float
    steps: int
    step_rho: float
    values: int

    def step_charge(self) -> Charge:
        """The charge of one planned step."""
        return Charge(rho=self.step_rho, tv=self.values * GAUSSIAN_TV)


def _at_order(order: float, delta: float, pure: float, rho: float) -> float:
    """``E + α R + c_α`` of totals ``pure`` and ``rho`` for a run of ``delta``."""
    delta_z = delta * (1.0 - SAMPLER_DELTA_SHARE)
    return pure + (conversion(order, order * rho, delta_z) if rho > 0 else 0.0)


def _run_epsilon(order: float, charges: Iterable[Charge], delta: float) -> tuple[float, float]:
    """``(E + α R + c_α, D)`` of ``charges`` at ``order`` for a run of ``delta``."""
    terms = [release_terms(c) for c in charges]
    pure = math.fsum(t.epsilon for t in terms)
    rho = math.fsum(t.rho for t in terms)
    return _at_order(order, delta, pure, rho), math.fsum(t.delta for t in terms)


def run_spent(allocation: RunAllocation, charges: Iterable[Charge]) -> float:
    """The epsilon a run's ``charges`` have used of its allocation, at its order.

    >>> run = allocate(epsilon=1.0, delta=1e-5, steps=80, values=1000)
    >>> run_spent(run, [run.step_charge()] * 80) <= 1.0
    True
    """
    return _run_epsilon(allocation.order, charges, allocation.delta)[0]


def run_fits(allocation: RunAllocation, history: Iterable[Charge], new: Charge) -> bool:
    """Whether ``new`` may be released after the run's ``history`` (a filter at one order).

    Sound under fully adaptive choices of each step's charge (Theorem 4 of
    ``docs/privacy.md``): the order is the allocation's, fixed before any step.

    >>> run = allocate(epsilon=1.0, delta=1e-5, steps=3, values=10)
    >>> step = run.step_charge()
    >>> run_fits(run, [step, step], step), run_fits(run, [step, step, step], step)
    (True, False)
    """
    epsilon, sampler = _run_epsilon(allocation.order, [*history, new], allocation.delta)
    return sampler <= allocation.delta * SAMPLER_DELTA_SHARE and epsilon <= allocation.epsilon


def allocate(*, epsilon: float, delta: float, steps: int, values: int) -> RunAllocation:
    """Fix a run's order and per-step rho from its public plan, before it reads anything.

    The per-step rho is the largest (up to the search) whose ``steps`` releases of ``values``
    values fit ``(epsilon, delta)`` at the best order for their total (:func:`best_order`);
    that order is then the run's.

    Args:
        epsilon: the run's total epsilon, finite and > 0.
        delta: the run's delta, in (0, 1).
        steps: the steps planned, >= 1.
        values: the most values one step noises, >= 1.

    Raises:
        ValueError: on invalid arguments, or a run no rho fits (its samplers' deltas alone
            exceed ``delta / 1024``).

    >>> run = allocate(epsilon=1.0, delta=1e-5, steps=80, values=1000)
    >>> round(run.order, 2), f"{run.step_rho:.4e}"
    (17.81, '3.8191e-04')
    """
    _check(epsilon, delta)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    if isinstance(values, bool) or not isinstance(values, int) or values < 1:
        raise ValueError(f"values must be a whole number >= 1, got {values!r}")

    def run_at(rho: float) -> RunAllocation:
        order = best_order(steps * rho, delta * (1.0 - SAMPLER_DELTA_SHARE))
        return RunAllocation(epsilon, delta, order, steps, rho, values)

    def fits(rho: float) -> bool:
        run = run_at(rho)
        step = release_terms(run.step_charge())
        # ``steps`` equal terms: their product is their fsum (both correctly rounded)
        used = _at_order(run.order, delta, steps * step.epsilon, steps * step.rho)
        return used <= epsilon and steps * step.delta <= delta * SAMPLER_DELTA_SHARE

    lo, hi = 1e-12, epsilon + 1.0
    if not fits(lo):
        raise ValueError(
            f"({epsilon:g}, {delta:g}) cannot pay for {steps} Gaussian steps of {values} values"
        )
    for _ in range(100):  # geometric bisection: rhos span orders of magnitude
        mid = math.sqrt(lo * hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return run_at(lo)
