"""Selecting quantiles over a public grid of candidates: permute-and-flip.

A quantile of private values cannot be released with additive noise (one value can move
a median across the whole range): it is *selected*. The candidates are a data-independent
grid over the values' public range ``[lo, hi]`` (:func:`candidates`): the values the data
can take when the tracker knows a public finite set of them (an integer column's values,
also after a cast to a float dtype), else every integer in it for integral values when
there are at most :data:`CANDIDATES`, else :data:`CANDIDATES` points from ``lo`` to ``hi``.
Candidate ``c`` scores, for the quantile ``alpha`` (OpenDP's score, which handles ties)::

    u(c) = -|(1 - alpha) #{x < c} - alpha #{x > c}|

Replacing one element moves ``#{x < c}`` and ``#{x > c}`` by at most 1 each, and when both
move they move in opposite directions (an element leaves one side for the other), so the
inner difference moves by at most ``(1 - alpha) + alpha = 1``. Replacing one subject moves
at most ``k`` elements (the tracker's bound, ``dpnode.core.privacy.tracker.selection_inputs``):
the score's sensitivity is ``k``.

The selection is **permute-and-flip** (McKenna and Sheldon 2020): the candidates in a
uniformly random order, each accepted with probability ``w(c) = exp(epsilon (u(c) - u*) /
(2 k))`` (``u*`` the best score), the first accepted released. It is epsilon-DP for the same
weights as the exponential mechanism (McSherry and Talwar 2007) and never less accurate in
expectation; report-noisy-max with exponential noise, which OpenDP runs, is the same
distribution. The best candidate is always accepted, so one pass over the order decides:
the work is the same whatever the values and the draws (a random order of every candidate,
a coin for every candidate).

Sampling is provably close to that distribution, and the distance is charged
(:attr:`SelectionPlan.sampler_tv`, as delta ``(1 + e^epsilon) tv`` like every release):

- ``alpha`` is taken to :data:`ALPHA_BITS` fractional bits, so that the score is an exact
  integer ``S(c) = |(2^b - a) #{x < c} - a #{x > c}|`` (int64 below ``2^31`` values, else
  Python integers: no overflow);
- the weights ``exp(-epsilon (S(c) - min S) / (2 k 2^b))`` are computed in float64: the
  best is exactly 1; an exponent of at most 40 in size is computed within ``40 * 4``
  units in the last place, so its weight is within a relative ``2^-45`` (with ``exp``'s own
  few ulps); a weight of an exponent beyond is below ``e^-40`` whatever it is computed as;
- each coin accepts when a uniform 62-bit integer is below ``floor(w(c) 2^62)`` (off by
  at most ``2^-62`` more), and the order sorts 128 random bits per candidate (a tie, of
  probability below ``m^2 2^-129``, falls back to the grid's order).

Couple each coin with its exact counterpart through one uniform: the two runs part only at
a coin the exact run examines (one before its first acceptance, or that one) on which they
disagree. Candidate ``c`` is examined with some probability ``P_c``, and ``sum_c P_c w(c)``
is the probability that the exact run releases something, 1; a coin disagrees with
probability ``|q(c) - w(c)| <= 2^-62 + 2^-45 w(c)``, or at most ``e^-40`` for a weight
beyond the exponent 40. So the released candidate's law is within total variation
``m 2^-62 + 2^-45 + m e^-40 + m^2 2^-129`` of permute-and-flip's, for ``m`` candidates
(:func:`sampler_tv`: about ``5e-14`` for 4097).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import samplers
from dpnode.core.dp.mechanisms import float_at_least, refusing_arithmetic
from dpnode.core.errors import InvalidRequestError

__all__ = [
    "ALPHA_BITS",
    "CANDIDATES",
    "Selection",
    "SelectionPlan",
    "candidates",
    "permute_and_flip",
    "plan_selection",
    "sampler_tv",
    "select_quantiles",
]

#: candidates of a range that is not a short run of integers
CANDIDATES = 4097
#: fractional bits ``alpha`` is taken to
ALPHA_BITS = 32
#: a coin's resolution (its threshold fits an int64)
_COIN_BITS = 62
#: relative error of a computed weight whose exponent is at most 40 in size (see the module)
WEIGHT_ERROR = 2.0**-45
#: weights of exponents beyond -this are below e^-this, computed as they may
_SMALL_EXPONENT = 40.0


def candidates(
    lo: float, hi: float, integral: bool, values: npt.NDArray[np.float64] | None = None
) -> npt.NDArray[np.float64]:
    """The public candidates for a quantile of values in ``[lo, hi]``, sorted: the public
    ``values`` the data can take (in the range) when they are known and few enough; else
    the integers in the range for integral values when there are few enough; else
    :data:`CANDIDATES` points from ``lo`` to ``hi``.

    >>> candidates(0.0, 4.0, True).tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0]
    >>> candidates(0.0, 4.0, False, np.array([0.5, 2.0, 0.5, 9.0])).tolist()
    [0.5, 2.0]
    >>> c = candidates(0.0, 1.0, False)
    >>> len(c), float(c[0]), float(c[-1]), bool(np.all(np.diff(c) > 0))
    (4097, 0.0, 1.0, True)
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise InvalidRequestError(f"a quantile needs a finite public range, got [{lo}, {hi}]")
    if values is not None:
        known = np.unique(np.asarray(values, dtype=np.float64))
        known = known[(known >= lo) & (known <= hi)]
        if 0 < known.size <= CANDIDATES:
            return known
    if integral:
        a, b = math.ceil(lo), math.floor(hi)
        if a > b:  # no integer in the range: its ends are the only sensible answers
            return np.array([lo, hi], dtype=np.float64) if lo < hi else np.array([lo])
        if b - a + 1 <= CANDIDATES:
            return np.arange(a, b + 1, dtype=np.float64)
    if lo == hi:
        return np.array([lo], dtype=np.float64)
    t = np.arange(CANDIDATES, dtype=np.float64) / (CANDIDATES - 1)  # exact: a power of 2
    width = hi - lo
    # lo + width * t is on a binary grid when the width is finite; else, without overflow
    grid = lo + width * t if math.isfinite(width) else lo * (1 - t) + hi * t
    grid[0], grid[-1] = lo, hi
    return np.maximum.accumulate(np.clip(grid, lo, hi))


def sampler_tv(count: int) -> float:
    """Total variation of one selection among ``count`` candidates from the exact
    permute-and-flip (see the module docstring), rounded up."""
    tv = count * 2.0**-_COIN_BITS + WEIGHT_ERROR + count * math.exp(-_SMALL_EXPONENT)
    tv += count * count * 2.0**-129
    return math.nextafter(tv * (1 + 2.0**-40), math.inf)


@dataclass(frozen=True)
class Selection:
    """One quantile of one output: one selection per group (``groups``; 0: ungrouped, one
    selection) over ``grid`` at the quantile ``alpha`` (in units of ``2^-ALPHA_BITS``), each
    with weights ``exp(epsilon u / (2 sensitivity))``."""

    grid: npt.NDArray[np.float64]
    alpha: int
    epsilon: float
    sensitivity: Fraction
    groups: int = 0

    @property
    def count(self) -> int:
        return max(self.groups, 1)


@dataclass(frozen=True)
class SelectionPlan:
    """One release's quantile selections, decided from public metadata only.

    Attributes:
        epsilon: the whole release's epsilon; each quantile asked for gets an equal share
            (basic composition), and within one, the groups share it (see
            :func:`plan_selection`).
        selections: per output, per quantile, in order.
        sampler_tv: the whole release's deviation from the exact mechanism.
        grouped: per output, whether it is per group.
    """

    epsilon: float
    selections: tuple[Selection, ...]
    sampler_tv: float
    grouped: tuple[bool, ...] = ()

    @property
    def count(self) -> int:
        """How many values the release selects (a quantile per group)."""
        return sum(s.count for s in self.selections)


@refusing_arithmetic
def plan_selection(
    *, epsilon: float, outputs: list[tuple[npt.NDArray[np.float64], list[float], int, int]]
) -> SelectionPlan:
    """Plan the quantile selections of a release at ``epsilon`` in total.

    ``outputs``: per output, its candidates, its quantiles, the most values one subject can
    move (``k``), and its number of groups (0: not grouped). Each of the ``M`` quantiles
    asked for gets ``epsilon / M``. Ungrouped, the score moves by at most ``k``. Grouped, each
    moved value leaves one group and enters another, moving the two groups' scores by
    ``1 - alpha`` or ``alpha`` each: ``2 max(alpha, 1 - alpha) k`` together at most (``k``
    for the median, and ``k`` with a single group), so every group's selection is calibrated
    to that total, and their privacy losses add up to the quantile's share.

    Raises:
        InvalidRequestError: a bad epsilon, or a quantile outside [0, 1].
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidRequestError(f"epsilon must be finite and > 0, got {epsilon!r}")
    asked = max(1, sum(len(alphas) for _, alphas, _, _ in outputs))
    share = epsilon / asked
    if Fraction(share) * asked > Fraction(epsilon):  # rounded up: the shares would exceed it
        share = math.nextafter(share, 0.0)
    if not share >= sys.float_info.min:
        raise InvalidRequestError(
            f"epsilon={epsilon!r} is too small to share among {asked} quantiles"
        )
    selections, tv = [], 0.0
    whole = 2**ALPHA_BITS
    for grid, alphas, k, groups in outputs:
        for alpha in alphas:
            if not 0 <= alpha <= 1:
                raise InvalidRequestError(f"a quantile must be in [0, 1], got {alpha!r}")
            units = round(alpha * whole)
            # a value leaving a group moves its score by 1 - alpha or alpha, and so does one
            # entering: across groups 2 max(alpha, 1 - alpha) per value moved, at least the
            # 1 of a value that changes within its group
            spread = Fraction(max(1, k))
            if groups > 1:
                spread *= max(Fraction(1), Fraction(2 * max(units, whole - units), whole))
            selections.append(Selection(grid, units, share, spread, groups))
            tv += max(groups, 1) * sampler_tv(len(grid))
    grouped = tuple(groups > 0 for *_, groups in outputs)
    return SelectionPlan(epsilon, tuple(selections), tv, grouped)


def _counts(
    values: npt.NDArray[np.float64],
    grid: npt.NDArray[np.float64],
    groups: npt.NDArray[np.int64] | None = None,
    count: int = 1,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``#{x < c}`` and ``#{x > c}`` for every candidate ``c`` of the sorted ``grid``: one
    row per group (values whose group is outside ``[0, count)`` count nowhere)."""
    m = grid.size
    if groups is None:
        groups = np.zeros(values.size, dtype=np.int64)
    inside = (groups >= 0) & (groups < count)
    # a discarded row for the rest; arithmetic, not np.where, which branches on each element
    row = (groups * inside + count * ~inside) * (m + 1)
    # x < c[j] iff j >= #{c <= x}; x > c[j] iff j < #{c < x}
    at_or_below = np.searchsorted(grid, values, side="right") + row
    below = np.searchsorted(grid, values, side="left") + row
    cells = (count + 1) * (m + 1)
    ats = np.bincount(at_or_below, minlength=cells).reshape(count + 1, m + 1)[:count, :m]
    bel = np.bincount(below, minlength=cells).reshape(count + 1, m + 1)[:count]
    sizes = bel.sum(axis=1, keepdims=True)
    less = np.cumsum(ats, axis=1)
    greater = sizes - np.cumsum(bel[:, :m], axis=1)
    return less.astype(np.int64), greater.astype(np.int64)


def select_quantiles(
    values: npt.NDArray[np.float64],
    selection: Selection,
    *,
    words: samplers.WordSource,
    groups: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.float64]:
    """One candidate of the selection's grid per group, by permute-and-flip (see the module
    docstring).

    ``values`` must be finite and inside the grid's range (the caller clips them there);
    ``groups`` gives each value's group (``None``: one group).
    """
    grid, count = selection.grid, selection.count
    if grid.size == 1:
        return np.full(count, float(grid[0]))
    less, greater = _counts(values, grid, groups, count)
    a, whole = selection.alpha, 1 << ALPHA_BITS
    if values.size < 2**31:  # exact in int64: (2^32 - a) * less < 2^63
        scores = np.abs((whole - a) * less - a * greater)
        gaps = (scores - scores.min(axis=1, keepdims=True)).astype(np.float64)
    else:  # exact integer scores as Python integers (no overflow whatever the count)
        big = np.abs((whole - a) * less.astype(object) - a * greater.astype(object))
        low = big.min(axis=1, keepdims=True)
        gaps = np.vectorize(float, otypes=[np.float64])(big - low)
    # rounded up: a larger sensitivity only flattens the weights
    factor = selection.epsilon / (2.0 * float_at_least(selection.sensitivity) * whole)
    return np.asarray(grid[_flip(gaps, factor, words)], dtype=np.float64)


def _flip(
    gaps: npt.NDArray[np.float64], factor: float, words: samplers.WordSource
) -> npt.NDArray[np.intp]:
    """Per row of ``gaps`` (each row's best candidate at 0, exact integers in float64), the
    candidate permute-and-flip releases with weights ``exp(-factor * gap)`` (see the module
    docstring for the coins, the order and their deviation)."""
    count, m = gaps.shape
    with np.errstate(under="ignore"):
        weights = np.exp(-factor * gaps)  # the best is exp(0) = 1 exactly
    thresholds = np.floor(np.ldexp(weights, _COIN_BITS)).astype(np.int64)  # the best: 2^62
    # a uniformly random order per row: 128 random bits per candidate (the order sorts
    # them, ties in the candidates' order)
    high, low = words(count * m).reshape(count, m), words(count * m).reshape(count, m)
    coins = (words(count * m) >> np.uint64(64 - _COIN_BITS)).astype(np.int64).reshape(count, m)
    accepted = coins < thresholds
    return first_in_order(high, low, accepted)


def permute_and_flip(
    scores: npt.NDArray[np.int64],
    *,
    epsilon: float,
    sensitivity: Fraction,
    words: samplers.WordSource,
) -> int:
    """The index of one of ``scores`` (exact integers, the higher the better), selected by
    permute-and-flip at ``epsilon`` for scores that move by at most ``sensitivity`` between
    neighbouring datasets: weights ``exp(epsilon (u - u*) / (2 sensitivity))``, with the
    deviation :func:`sampler_tv` of ``len(scores)`` candidates, as for quantiles.

    Raises:
        InvalidRequestError: no candidates, a bad epsilon or sensitivity.

    >>> from dpnode.core.dp.samplers import word_source
    >>> permute_and_flip(np.array([0, 10**9, 3]), epsilon=1.0, sensitivity=Fraction(1),
    ...                  words=word_source())
    1
    """
    if scores.ndim != 1 or scores.size == 0:
        raise InvalidRequestError("a selection needs at least one candidate")
    if not (math.isfinite(epsilon) and epsilon > 0) or sensitivity <= 0:
        raise InvalidRequestError(
            f"a selection needs a finite epsilon > 0 and a sensitivity > 0, got "
            f"{epsilon!r} and {sensitivity}"
        )
    exact = scores.astype(object)  # Python integers: no overflow in the differences
    gaps = np.array([float(g) for g in exact.max() - exact], dtype=np.float64)
    factor = epsilon / (2.0 * float_at_least(sensitivity))
    return int(_flip(gaps.reshape(1, -1), factor, words)[0])


def first_in_order(
    high: npt.NDArray[np.uint64], low: npt.NDArray[np.uint64], accepted: npt.NDArray[np.bool_]
) -> npt.NDArray[np.intp]:
    """Per row, the index of the accepted candidate that comes first in the order that sorts
    the keys ``(high, low)``, ties in index order: the smallest accepted key. Every row must
    have an accepted candidate.

    The same answer as sorting the keys (``np.lexsort``) and taking the first accepted in
    that order, in linear time and with the same steps whatever is accepted: rejected
    candidates are set aside by arithmetic (an OR with all ones), not a branch.

    >>> high = np.array([[5, 1, 1, 0]], dtype=np.uint64)
    >>> low = np.array([[0, 9, 3, 0]], dtype=np.uint64)
    >>> first_in_order(high, low, np.array([[True, True, True, False]])).tolist()
    [2]
    """
    # a rejected candidate's high word is made the largest (an accepted one may be too)
    masked_high = high | _all_ones(~accepted)
    least = (masked_high == masked_high.min(axis=1, keepdims=True)) & accepted
    masked_low = low | _all_ones(~least)
    best = least & (masked_low == masked_low.min(axis=1, keepdims=True))
    first: npt.NDArray[np.intp] = np.argmax(best, axis=1)  # the first of them: grid order
    return first


def _all_ones(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint64]:
    """Every bit set where ``mask`` holds, else 0: an OR with it makes a key the largest."""
    return np.uint64(0) - mask.astype(np.uint64)
