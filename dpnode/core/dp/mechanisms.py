"""The Laplace and Gaussian mechanisms on the 2^k grid.

``laplace`` is epsilon-DP: discrete Laplace noise ``P(z) ∝ exp(-|z|/t)`` per coordinate changes
the probability of any output by at most ``exp(Σ|d_j| / t)`` when an integer query moves by
``d`` (the geometric mechanism, Ghosh, Roughgarden & Sundararajan 2009). ``gaussian`` is
rho-zCDP: the discrete Gaussian ``N_Z(0, s²)`` shifted by an integer ``d_j`` has Rényi
divergence at most ``α d_j² / (2 s²)``, as the continuous one, and divergences of independent
coordinates add, so an integer query of L2 sensitivity ``D`` gets ``D² / (2 s²)``-zCDP
(Canonne, Kamath & Steinke 2020, Theorem 14). Both hold for the grid-rounded query
(:mod:`dpnode.core.dp.grid`), up to the samplers' total-variation deviation, which the
:class:`Release` reports for charging.

Both arguments hold for any real sensitivity bound of an integer query, so a query proven
integer-valued on every dataset (``integral=True``: the tracker's proof, from public metadata)
is noised on the grid ``2^0 = 1`` with no rounding term at all, rounding being the identity on
integers: scale ``Δ₁ / ε`` or ``s`` with ``Δ₂² <= 2 rho s²``, the textbook ones, whenever the
fine grid would be no coarser than 1 and the sampler takes that scale (else the fine grid,
as for any other value). The change of an integer query is an integer vector, so its L1 norm
is at most ``floor(Δ₁)`` and its squared L2 norm at most ``floor(Δ₂²)``: the tracker's bounds,
widened a little for its own float arithmetic, are taken down to those.

The charge is what the caller asked for and never depends on the data: the noise scale is
rounded *up* so that the mechanism meets it exactly (checked in rational arithmetic).

A sensitivity of 0 means the values are the same on every neighbouring dataset, so they are
public: they are returned unchanged (no grid is needed; ``grid_exponent`` is ``None``), and the
charge is still the one asked for, so that the cost of a request never depends on anything but
the request.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import grid, samplers
from dpnode.core.dp.accounting import Charge, calibrate_rho
from dpnode.core.errors import InvalidRequestError

__all__ = [
    "NoisePlan",
    "Release",
    "apply_noise",
    "float_at_least",
    "gaussian",
    "gaussian_scale",
    "laplace",
    "laplace_scale",
    "plan_gaussian",
    "plan_laplace",
]


@dataclass(frozen=True, eq=False)
class Release:
    """A noised result and what it cost.

    Attributes:
        values: the noised float64 values (same shape as the input), on the grid ``2^k``.
        mechanism: ``"laplace"``, ``"gaussian"``, ``"exponential"`` (a selection) or
            ``"threshold"`` (keys kept above a noisy threshold).
        grid_exponent: ``k``, or ``None`` when no noise was needed (sensitivity 0 or no values).
        scale: the noise scale in value units: Laplace ``b`` (pmf ∝ exp(-|z|/b) on the grid),
            Gaussian ``sigma`` (pmf ∝ exp(-z²/(2 sigma²)) on the grid); 0 without noise.
        sensitivity: the sensitivity of the grid-rounded query that the noise covers (L1 for
            Laplace, L2 for Gaussian), in value units; at least the declared one.
        epsilon: pure-DP epsilon charged (Laplace), else 0.
        rho: zCDP rho charged (Gaussian), else 0.
        sampler_tv: total-variation distance of the whole noise vector from the ideal one.
    """

    values: npt.NDArray[np.float64]
    mechanism: Literal["laplace", "gaussian", "exponential", "threshold"]
    grid_exponent: int | None
    scale: float
    sensitivity: float
    epsilon: float
    rho: float
    sampler_tv: float

    @property
    def charge(self) -> Charge:
        """The charge for the budget filter (:func:`dpnode.core.dp.accounting.fits`)."""
        return Charge(epsilon=self.epsilon, rho=self.rho, tv=self.sampler_tv)


def _positive(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise InvalidRequestError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _sensitivity(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise InvalidRequestError(f"{name} must be finite and >= 0, got {value!r}")
    return v


_P = ParamSpec("_P")
_R = TypeVar("_R")


def refusing_arithmetic(plan: Callable[_P, _R]) -> Callable[_P, _R]:
    """``plan``, with an arithmetic error on its public parameters (a division by zero or an
    overflow, at an epsilon far outside what the node accepts) raised as a clear
    :class:`InvalidRequestError` instead."""

    @functools.wraps(plan)
    def planned(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return plan(*args, **kwargs)
        except ArithmeticError as exc:
            asked = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if isinstance(v, int | float))
            raise InvalidRequestError(
                f"the noise cannot be computed for {asked} ({exc}): ask for an epsilon "
                "between 1e-9 and 1e6"
            ) from None

    return planned


def _beyond_float64(units: float, k: int, sens: float, budget: str) -> float:
    """``units`` grid steps of ``2^k``, or a clear refusal where that exceeds a float64."""
    try:
        return math.ldexp(units, k)
    except OverflowError:
        raise InvalidRequestError(
            f"the noise for a sensitivity of {sens:g} at {budget} would exceed the largest "
            "float64: narrow the inputs' bounds or spend more"
        ) from None


def _as_values(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"values must be numeric: {exc}") from None


def float_at_least(x: Fraction) -> float:
    """The smallest float not below ``x`` (a sensitivity or scale rounded the safe way)."""
    f = float(x)
    return f if Fraction(f) >= x else math.nextafter(f, math.inf)


def _sqrt_at_least(n: int) -> Fraction:
    r = math.isqrt(n)
    if r * r == n:
        return Fraction(r)
    f = math.sqrt(n)
    while Fraction(f) ** 2 < n:
        f = math.nextafter(f, math.inf)
    return Fraction(f)


@dataclass(frozen=True, eq=False)
class NoisePlan:
    """Everything about a release that is decided before any value is seen.

    Made by :func:`plan_laplace` or :func:`plan_gaussian` from the sensitivity, the privacy
    parameters and the number of values only, so that what a release costs (``epsilon``,
    ``rho``, ``sampler_tv``) and whether it is possible at all are settled from public
    metadata; :func:`apply_noise` then noises the values.

    Attributes:
        mechanism: ``"laplace"``, ``"gaussian"``, ``"exponential"`` (a selection) or
            ``"threshold"`` (keys kept above a noisy threshold).
        count: number of values the plan noises.
        grid_exponent: ``k``, or ``None`` when no noise is needed (sensitivity 0 or no values).
        scale, sensitivity, epsilon, rho, sampler_tv: as in :class:`Release`.
        sampler: the sampler's plan (``None`` without noise).
    """

    mechanism: Literal["laplace", "gaussian", "exponential", "threshold"]
    count: int
    grid_exponent: int | None
    scale: float
    sensitivity: float
    epsilon: float
    rho: float
    sampler_tv: float
    sampler: samplers.LaplacePlan | samplers.GaussianPlan | None

    def fits_grid(self, largest: float) -> bool:
        """Whether values of magnitude up to ``largest`` have grid indices a double holds."""
        if self.grid_exponent is None:
            return math.isfinite(largest)
        with np.errstate(over="ignore"):
            index = float(np.ldexp(largest, -self.grid_exponent))
        return math.isfinite(index) and index < 2.0**1000


def apply_noise(
    values: npt.ArrayLike, plan: NoisePlan, *, source: samplers.Source = "auto"
) -> Release:
    """Noise ``values`` as ``plan`` says: the data-dependent half of a release.

    Without noise (``plan.grid_exponent is None``) the values are returned as they are,
    with ``-0.0`` as ``0.0``.

    Raises:
        InvalidRequestError: ``values`` is not numeric or has another count than the plan.
        EvaluationError: a value is NaN, infinite, or too large for the grid (a caller
            that must not fail on values clips them to public bounds first).
    """
    x = _as_values(values)
    if x.size != plan.count:
        raise InvalidRequestError(f"the plan noises {plan.count} values, got {x.size}")
    if plan.sampler is None or plan.grid_exponent is None:
        grid.round_to_grid(x.reshape(-1), 0)  # refuse NaN/inf all the same
        noised = x + 0.0  # -0.0 + 0.0 == +0.0: the sign of a zero is not released
    else:
        k = plan.grid_exponent
        if plan.sampler.max_abs >= 1 << 53:  # the planners keep scales far below this
            raise AssertionError("noise would not be exact in float64")
        indices = grid.round_to_grid(x.reshape(-1), k)
        noise = samplers.sample(plan.sampler, indices.size, source=source)
        # Exact integers in float64: the sum is the correctly rounded exact integer sum.
        indices += noise.astype(np.float64)
        noised = grid.to_values(indices, k).reshape(x.shape)
    return Release(
        values=noised,
        mechanism=plan.mechanism,
        grid_exponent=plan.grid_exponent,
        scale=plan.scale,
        sensitivity=plan.sensitivity,
        epsilon=plan.epsilon,
        rho=plan.rho,
        sampler_tv=plan.sampler_tv,
    )


@refusing_arithmetic
def plan_laplace(
    *, sensitivity_l1: float, epsilon: float, count: int, integral: bool = False
) -> NoisePlan:
    """Plan discrete Laplace noise on a 2^k grid for ``count`` values: epsilon-DP.

    Args:
        sensitivity_l1: L1 sensitivity of the values over neighbouring datasets.
        epsilon: privacy parameter, finite and > 0.
        count: number of values released (>= 0).
        integral: every value is an integer on every neighbouring dataset (proven from
            public metadata): the grid 1, without rounding inflation, where it fits, for the
            integer query's L1 sensitivity ``floor(sensitivity_l1)`` (its change is an
            integer).

    Raises:
        InvalidRequestError: on a bad epsilon or sensitivity, or an epsilon so small that
            the noise would exceed 2^44 grid steps (``n / epsilon`` alone).

    >>> p = plan_laplace(sensitivity_l1=1.0, epsilon=1.0, count=2)
    >>> p.grid_exponent, p.scale, p.epsilon
    (-11, 1.0009765625, 1.0)
    >>> p = plan_laplace(sensitivity_l1=1.0, epsilon=1.0, count=2, integral=True)
    >>> p.grid_exponent, p.scale, p.sensitivity
    (0, 1.0, 1.0)
    """
    eps = _positive("epsilon", epsilon)
    sens = _sensitivity("sensitivity_l1", sensitivity_l1)
    if sens == 0 or count <= 0:
        return NoisePlan("laplace", max(count, 0), None, 0.0, 0.0, eps, 0.0, 0.0, None)
    k, t, d1 = _laplace_grid(sens, eps, count, integral)
    sampler = samplers.laplace_plan(t)
    return NoisePlan(
        mechanism="laplace",
        count=count,
        grid_exponent=k,
        scale=_beyond_float64(t, k, sens, f"epsilon {eps:g}"),
        sensitivity=_beyond_float64(d1, k, sens, f"epsilon {eps:g}"),
        epsilon=eps,
        rho=0.0,
        sampler_tv=count * sampler.tv_bound,
        sampler=sampler,
    )


@refusing_arithmetic
def plan_gaussian(
    *,
    sensitivity_l2: float,
    count: int,
    rho: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    integral: bool = False,
) -> NoisePlan:
    """Plan discrete Gaussian noise on a 2^k grid for ``count`` values: rho-zCDP.

    Give either ``rho`` or both ``epsilon`` and ``delta``; the latter is calibrated to the
    largest rho whose zCDP guarantee implies (epsilon, delta)-DP (CKS 2020, Corollary 13), and
    the release charges that rho. ``integral``: every value is an integer on every
    neighbouring dataset (proven from public metadata), as for :func:`plan_laplace`; the
    squared L2 change is then an integer, at most ``floor(sensitivity_l2²)``.

    Raises:
        InvalidRequestError: on bad or inconsistent privacy parameters or sensitivity, or a rho
            so small that the noise would exceed 2^44 grid steps (``sqrt(n / 2 rho)`` alone).

    >>> p = plan_gaussian(sensitivity_l2=2.0, count=4, rho=0.5)
    >>> p.grid_exponent, p.rho, p.scale > 2.0
    (-10, 0.5, True)
    >>> p = plan_gaussian(sensitivity_l2=2.0, count=4, rho=0.5, integral=True)
    >>> p.grid_exponent, p.scale == math.nextafter(2.0, 3.0), p.sensitivity
    (0, True, 2.0)
    """
    target = _gaussian_rho(rho, epsilon, delta)
    sens = _sensitivity("sensitivity_l2", sensitivity_l2)
    if sens == 0 or count <= 0:
        return NoisePlan("gaussian", max(count, 0), None, 0.0, 0.0, 0.0, target, 0.0, None)
    k, s, d2 = _gaussian_grid(sens, target, count, integral)
    sampler = samplers.gaussian_plan(s)
    return NoisePlan(
        mechanism="gaussian",
        count=count,
        grid_exponent=k,
        scale=_beyond_float64(s, k, sens, f"rho {target:g}"),
        sensitivity=_beyond_float64(d2, k, sens, f"rho {target:g}"),
        epsilon=0.0,
        rho=target,
        sampler_tv=count * sampler.tv_bound,
        sampler=sampler,
    )


def laplace(
    values: npt.ArrayLike,
    *,
    sensitivity_l1: float,
    epsilon: float,
    source: samplers.Source = "auto",
) -> Release:
    """Release ``values`` with discrete Laplace noise on a 2^k grid: epsilon-DP.

    :func:`plan_laplace` for the values' count, then :func:`apply_noise`.

    Raises:
        InvalidRequestError: as :func:`plan_laplace`, or non-numeric values.
        EvaluationError: if a value is NaN, infinite, or too large for the grid.

    >>> r = laplace([10.0, 20.0], sensitivity_l1=1.0, epsilon=1.0)
    >>> r.grid_exponent, r.scale, r.epsilon
    (-11, 1.0009765625, 1.0)
    """
    x = _as_values(values)
    plan = plan_laplace(sensitivity_l1=sensitivity_l1, epsilon=epsilon, count=x.size)
    return apply_noise(x, plan, source=source)


def gaussian(
    values: npt.ArrayLike,
    *,
    sensitivity_l2: float,
    rho: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    source: samplers.Source = "auto",
) -> Release:
    """Release ``values`` with discrete Gaussian noise on a 2^k grid: rho-zCDP.

    :func:`plan_gaussian` for the values' count, then :func:`apply_noise`.

    Raises:
        InvalidRequestError: as :func:`plan_gaussian`, or non-numeric values.
        EvaluationError: if a value is NaN, infinite, or too large for the grid.

    >>> r = gaussian([1.0, 2.0, 3.0, 4.0], sensitivity_l2=2.0, rho=0.5)
    >>> r.grid_exponent, r.rho, r.scale > 2.0
    (-10, 0.5, True)
    """
    x = _as_values(values)
    plan = plan_gaussian(
        sensitivity_l2=sensitivity_l2, count=x.size, rho=rho, epsilon=epsilon, delta=delta
    )
    return apply_noise(x, plan, source=source)


def _samples(plan: Callable[[float], object], scale: float) -> bool:
    """Whether the sampler can be planned at ``scale`` (grid units): a scale far below one
    grid step (an epsilon beyond the documented range on the integer grid) underflows its
    tables, and the fine grid, whose scale is never that small, is used instead.

    >>> _samples(samplers.laplace_plan, 1.0), _samples(samplers.laplace_plan, 1e-9)
    (True, False)
    """
    try:
        plan(scale)
    except ArithmeticError:
        return False
    return True


@functools.lru_cache(maxsize=256)  # public numbers in, exact arithmetic: once, not per publish
def _laplace_grid(sens: float, eps: float, n: int, integral: bool) -> tuple[int, float, float]:
    """Grid exponent k, scale t (grid units) and rounded-query L1 sensitivity (grid units)."""
    k = grid.finest_exponent(sens, n, norm=1)
    # integers on the grid 1: rounding moves nothing, no inflation; and an integer query's
    # L1 change is an integer, so at most floor(Δ₁) (0: a fine grid, as for any value)
    whole = math.floor(Fraction(sens))
    if integral and k <= 0 and whole >= 1:
        t = float_at_least(Fraction(whole) / Fraction(eps))
        if t <= samplers.MAX_SCALE and _samples(samplers.laplace_plan, t):
            return 0, t, float(whole)
    while True:
        # L1 sensitivity of the rounded query, in grid units: floor(Δ/2^k) + n.
        steps = math.floor(Fraction(sens) / Fraction(2) ** k)
        d_int = steps + n
        t = float_at_least(Fraction(d_int) / Fraction(eps))
        if t <= samplers.MAX_SCALE:
            return k, t, float(d_int)
        if steps == 0:  # the rounding term n / epsilon alone is too large: no grid helps
            raise InvalidRequestError(_too_small("epsilon", eps, n))
        k += 1


@functools.lru_cache(maxsize=256)  # public numbers in, exact arithmetic: once, not per publish
def _gaussian_grid(sens: float, rho: float, n: int, integral: bool) -> tuple[int, float, float]:
    """Grid exponent k, parameter s (grid units) and rounded-query L2 sensitivity (grid units)."""
    k = grid.finest_exponent(sens, n, norm=2)
    # integers on the grid 1: rounding moves nothing, no inflation; and an integer query's
    # squared L2 change is an integer, so at most floor(Δ₂²) (0: a fine grid)
    whole = math.floor(Fraction(sens) ** 2)
    if integral and k <= 0 and whole >= 1:
        d2 = float(_sqrt_at_least(whole))
        s = _gaussian_parameter(d2, rho)
        if s <= samplers.MAX_SCALE and _samples(samplers.gaussian_plan, s):
            return 0, s, d2
    while True:
        # L2 sensitivity of the rounded query, in grid units: at most Δ/2^k + sqrt(n).
        steps = Fraction(sens) / Fraction(2) ** k
        d2 = float_at_least(steps + _sqrt_at_least(n))
        s = _gaussian_parameter(d2, rho)
        if s <= samplers.MAX_SCALE:
            return k, s, d2
        if steps < 1:  # the rounding term sqrt(n) dominates: a coarser grid cannot help
            raise InvalidRequestError(_too_small("rho", rho, n))
        k += 1


def _gaussian_parameter(d2: float, rho: float) -> float:
    """The smallest float ``s`` above ``d2 / sqrt(2 rho)`` with ``d2² <= 2 rho s²`` exactly."""
    two_rho = 2 * Fraction(rho)
    s = math.nextafter(d2 / math.sqrt(2 * rho), math.inf)
    while Fraction(d2) ** 2 > two_rho * Fraction(s) ** 2:
        s = math.nextafter(s, math.inf)
    return s


def laplace_scale(
    *, sensitivity_l1: float, epsilon: float, count: int, integral: bool = False
) -> float:
    """The noise scale ``b`` that :func:`laplace` would use, without noising anything.

    Includes the grid's inflation of the sensitivity, so it is exactly ``Release.scale``
    (of a plan with the same ``integral``: :func:`plan_laplace`).

    Raises:
        InvalidRequestError: as :func:`plan_laplace`.

    >>> laplace_scale(sensitivity_l1=1.0, epsilon=1.0, count=2)
    1.0009765625
    >>> laplace_scale(sensitivity_l1=2.0, epsilon=1.0, count=2, integral=True)
    2.0
    """
    plan = plan_laplace(
        sensitivity_l1=sensitivity_l1, epsilon=epsilon, count=count, integral=integral
    )
    return plan.scale


def gaussian_scale(
    *,
    sensitivity_l2: float,
    count: int,
    rho: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    integral: bool = False,
) -> float:
    """The noise parameter ``sigma`` that :func:`gaussian` would use, without noising anything.

    Includes the grid's inflation of the sensitivity, so it is exactly ``Release.scale``
    (of a plan with the same ``integral``: :func:`plan_gaussian`).

    Raises:
        InvalidRequestError: as :func:`plan_gaussian`.

    >>> round(gaussian_scale(sensitivity_l2=1.0, count=1, rho=0.5), 4)
    1.001
    """
    plan = plan_gaussian(
        sensitivity_l2=sensitivity_l2,
        count=count,
        rho=rho,
        epsilon=epsilon,
        delta=delta,
        integral=integral,
    )
    return plan.scale


def _too_small(name: str, value: float, n: int) -> str:
    return (
        f"{name}={value!r} is too small for {n} values: the noise scale would exceed the "
        f"samplers' limit of 2^44 grid steps; ask for a larger {name}"
    )


def _gaussian_rho(rho: float | None, epsilon: float | None, delta: float | None) -> float:
    if rho is not None:
        if epsilon is not None or delta is not None:
            raise InvalidRequestError("give either rho or (epsilon, delta), not both")
        return _positive("rho", rho)
    if epsilon is None or delta is None:
        raise InvalidRequestError("the Gaussian mechanism needs rho, or epsilon and delta")
    eps = _positive("epsilon", epsilon)
    d = _positive("delta", delta)
    if d >= 1:
        raise InvalidRequestError(f"delta must be < 1, got {delta!r}")
    return calibrate_rho(eps, d)
