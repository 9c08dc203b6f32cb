"""The exponential mechanism for quantiles, over a public grid of candidates.

A quantile of private values cannot be released with additive noise (one value can move
a median across the whole range): it is *selected*. The candidates are a data-independent
grid over the values' public range ``[lo, hi]`` (:func:`candidates`): every integer in it
for integral values when there are at most :data:`CANDIDATES`, else :data:`CANDIDATES`
points from ``lo`` to ``hi``. Candidate ``c`` scores, for the quantile ``alpha`` (OpenDP's
score, which handles ties)::

    u(c) = -|(1 - alpha) #{x < c} - alpha #{x > c}|

Replacing one element moves ``#{x < c}`` and ``#{x > c}`` by at most 1 each, and when both
move they move in opposite directions (an element leaves one side for the other), so the
inner difference moves by at most ``(1 - alpha) + alpha = 1``. Replacing one subject moves
at most ``k`` elements (the tracker's bound, ``node.privacy.tracker.selection_inputs``):
the score's sensitivity is ``k``, and choosing ``c`` with probability proportional to
``exp(epsilon u(c) / (2 k))`` is epsilon-DP (McSherry and Talwar 2007).

Sampling is provably close to that distribution, and the distance is charged
(:attr:`SelectionPlan.sampler_tv`, as delta ``(1 + e^epsilon) tv`` like every release):

- ``alpha`` is taken to :data:`ALPHA_BITS` fractional bits, so that the score is an exact
  integer ``S(c) = |(2^b - a) #{x < c} - a #{x > c}|`` (Python integers: no overflow);
- the weights ``exp(-epsilon (S(c) - min S) / (2 k 2^b))`` are computed in float64: the
  largest is exactly 1, every exponent above -745 has a relative error below ``2^-50``
  and ``exp`` a few ulps, so each weight is within a relative :data:`WEIGHT_ERROR`, and a
  weight that underflows is below ``e^-744``;
- the weights become integers ``W(c) = floor(w(c) 2^50)`` and the choice is the first
  candidate whose running sum of ``W`` exceeds a uniform integer below their total, drawn
  as 128 random bits modulo the total (bias below ``2^-66``).

Altogether the chosen candidate's distribution is within total variation
``m 2^-50 + WEIGHT_ERROR + m e^-744 + 2^-66`` of the exact one, for ``m`` candidates
(:func:`sampler_tv`). The work is the same whatever the values: counts by one binary search
per value and a bincount, then arithmetic on every candidate, and one fixed-size draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from node.dp import samplers
from node.errors import InvalidRequestError

__all__ = [
    "ALPHA_BITS",
    "CANDIDATES",
    "SelectionPlan",
    "candidates",
    "plan_selection",
    "sampler_tv",
    "select_quantile",
]

#: candidates of a range that is not a short run of integers
CANDIDATES = 4097
#: fractional bits ``alpha`` is taken to
ALPHA_BITS = 32
#: the weights' integer scale
_WEIGHT_BITS = 50
#: relative error of a computed weight whose exponent is above -745 (see the module)
WEIGHT_ERROR = 2.0**-38


def candidates(lo: float, hi: float, integral: bool) -> npt.NDArray[np.float64]:
    """The public candidates for a quantile of values in ``[lo, hi]``: sorted, from
    ``lo`` to ``hi``; the integers in it for integral values when there are few enough.

    >>> candidates(0.0, 4.0, True).tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0]
    >>> c = candidates(0.0, 1.0, False)
    >>> len(c), float(c[0]), float(c[-1]), bool(np.all(np.diff(c) > 0))
    (4097, 0.0, 1.0, True)
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise InvalidRequestError(f"a quantile needs a finite public range, got [{lo}, {hi}]")
    if integral:
        a, b = math.ceil(lo), math.floor(hi)
        if a > b:  # no integer in the range: its ends are the only sensible answers
            return np.array([lo, hi], dtype=np.float64) if lo < hi else np.array([lo])
        if b - a + 1 <= CANDIDATES:
            return np.arange(a, b + 1, dtype=np.float64)
    if lo == hi:
        return np.array([lo], dtype=np.float64)
    t = np.arange(CANDIDATES, dtype=np.float64) / (CANDIDATES - 1)
    grid = lo * (1 - t) + hi * t  # no overflow, whatever the range
    grid[0], grid[-1] = lo, hi
    return np.maximum.accumulate(np.clip(grid, lo, hi))


def sampler_tv(count: int) -> float:
    """Total variation of one selection among ``count`` candidates from the exact
    exponential mechanism (see the module docstring), rounded up."""
    tv = count * 2.0**-_WEIGHT_BITS + WEIGHT_ERROR + count * math.exp(-744) + 2.0**-66
    return math.nextafter(tv * (1 + 2.0**-40), math.inf)


@dataclass(frozen=True)
class SelectionPlan:
    """One release's quantile selections, decided from public metadata only.

    Attributes:
        epsilon: the whole release's epsilon; each of the ``count`` selections gets an equal
            share (basic composition).
        sensitivity: per selection, the most elements one subject can move (the score's
            sensitivity), at least 1.
        grids: per selection, its candidates.
        alphas: per selection, the quantile, in units of ``2^-ALPHA_BITS``.
        sampler_tv: the whole release's deviation from the exact mechanism.
    """

    epsilon: float
    sensitivity: tuple[int, ...]
    grids: tuple[npt.NDArray[np.float64], ...]
    alphas: tuple[int, ...]
    sampler_tv: float

    @property
    def count(self) -> int:
        return len(self.alphas)

    @property
    def epsilon_each(self) -> float:
        return self.epsilon / self.count if self.count else self.epsilon


def plan_selection(
    *,
    epsilon: float,
    sensitivity: list[int],
    grids: list[npt.NDArray[np.float64]],
    alphas: list[float],
) -> SelectionPlan:
    """Plan ``len(alphas)`` quantile selections at ``epsilon`` in total.

    Raises:
        InvalidRequestError: a bad epsilon, or a quantile outside [0, 1].
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidRequestError(f"epsilon must be finite and > 0, got {epsilon!r}")
    units = []
    for alpha in alphas:
        if not 0 <= alpha <= 1:
            raise InvalidRequestError(f"a quantile must be in [0, 1], got {alpha!r}")
        units.append(round(alpha * 2**ALPHA_BITS))
    tv = sum(sampler_tv(len(g)) for g in grids)
    return SelectionPlan(
        epsilon, tuple(max(1, int(k)) for k in sensitivity), tuple(grids), tuple(units), tv
    )


def _counts(
    values: npt.NDArray[np.float64], grid: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``#{x < c}`` and ``#{x > c}`` for every candidate ``c`` of the sorted ``grid``."""
    m = grid.size
    # x < c[j] iff j >= #{c <= x}; x > c[j] iff j < #{c < x}
    at_or_below = np.searchsorted(grid, values, side="right")
    below = np.searchsorted(grid, values, side="left")
    less = np.cumsum(np.bincount(at_or_below, minlength=m + 1)[:m])
    greater = values.size - np.cumsum(np.bincount(below, minlength=m + 1)[:m])
    return less.astype(np.int64), greater.astype(np.int64)


def select_quantile(
    values: npt.NDArray[np.float64],
    grid: npt.NDArray[np.float64],
    alpha_units: int,
    *,
    epsilon: float,
    sensitivity: int,
    words: samplers.WordSource,
) -> float:
    """One candidate of ``grid``, by the exponential mechanism (see the module docstring).

    ``values`` must be finite and inside the grid's range (the caller clips them there).
    """
    if grid.size == 1:
        return float(grid[0])
    less, greater = _counts(values, grid)
    a, whole = alpha_units, 1 << ALPHA_BITS
    # exact integer scores, as Python integers (no overflow whatever the count)
    scores = np.abs(
        (whole - a) * less.astype(object) - a * greater.astype(object)
    )  # object array of ints
    best = min(scores)
    gaps = np.array([float(s - best) for s in scores], dtype=np.float64)
    with np.errstate(under="ignore"):
        weights = np.exp(-(epsilon / (2.0 * sensitivity * whole)) * gaps)
    scaled = np.floor(np.ldexp(weights, _WEIGHT_BITS)).astype(np.int64)
    running = np.cumsum(scaled)  # below CANDIDATES * 2^50 < 2^63
    total = int(running[-1])
    hi, lo = (int(w) for w in words(2))
    draw = ((hi << 64) | lo) % total
    return float(grid[int(np.searchsorted(running, draw, side="right"))])
