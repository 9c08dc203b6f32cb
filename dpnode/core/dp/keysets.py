"""Releasing the keys present in private data: noisy counts kept above a threshold.

A key set that is not public (the zip codes a column holds) cannot be enumerated and noised
like a histogram over a public domain: a key absent from one dataset and present in its
neighbour would show by its mere presence. Each key *present* in the data gets its count plus
discrete Laplace noise ``P(z) ∝ exp(-|z|/t)`` with ``t = 2k / epsilon`` on the grid
``2^-GRID_BITS`` (the counts are integers, on it too: the textbook argument holds exactly),
and is released (with its noisy count) only when that noisy count is at least ``tau``
(Korolova, Kenthapadi, Mishra & Ntoulas 2009; OpenDP's ``make_laplace_threshold``).

``k`` is how many rows replacing one subject may change (one per subject: ``k = 1``). Replacing
them moves counts by at most ``2k`` in L1, and the keys present in one dataset only have
counts ``c_1, c_2, ...`` adding up to at most ``k``. Such a key is released with probability
``P[c + Z >= tau] = q^m / (1 + q)`` (``m = (tau - c) 2^GRID_BITS``, ``q = e^(-1/(t 2^GRID_BITS))``
in grid units), convex in
``c``: the worst of them together is one key of count ``k - j + 1`` and ``j - 1`` keys of count
1, for some ``j`` in ``1..k`` (:func:`bad_probability`). ``tau`` is the smallest grid value for
which that is at most ``delta`` (:func:`threshold`), exact up to the float arithmetic of a
few exponentials, which rounds the wrong way by far less than the relative ``1e-9`` kept as a
margin. The argument that this is ``(epsilon, delta)``-DP, and why ``delta`` must stay below
``1 - e^(-epsilon / 2k)``, is in ``docs/privacy.md`` ("Keys released above a threshold").

The released keys are sorted (their order in the data is not released), and the work does
not depend on how many keys there are: noise is drawn for every possible key (at most the
row count, or the size of the keys' public domain).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import samplers
from dpnode.core.errors import InvalidRequestError

__all__ = ["KeysPlan", "bad_probability", "plan_keys", "release_keys", "threshold"]

#: Relative margin on the float arithmetic of the tail probabilities.
_MARGIN = 1e-9
#: Counts are noised on the grid ``2^-GRID_BITS``: a finer threshold than the integers, and a
#: tail as light as the continuous Laplace's (the integers' is ``2 / (1 + e^(-epsilon/2))``
#: times heavier, a whole count of threshold at epsilon 2).
GRID_BITS = 10
_UNIT = 1 << GRID_BITS


def _tail(m: int, scale: float) -> float:
    """``P[Z >= m]`` for the discrete Laplace of scale ``scale``, ``m >= 1``: ``q^m / (1 + q)``.

    >>> round(_tail(1, 1.0), 6)  # e^-1 / (1 + e^-1)
    0.268941
    """
    q = math.exp(-1.0 / scale)
    return math.exp(-m / scale) / (1.0 + q)


def bad_probability(tau: float, scale: float, k: int = 1) -> float:
    """The most probability that some key present in only one of two neighbouring datasets
    is released, for a threshold ``tau > k`` on the grid ``2^-GRID_BITS`` and noise of scale
    ``scale`` (in counts) on it: a key of true count ``c <= k`` clears it with
    ``P[Z >= tau - c]``, and the counts of such keys add up to at most ``k``.

    >>> f"{bad_probability(16.0, 2.0):.6e}"  # about e^-7.5 / 2
    '2.766097e-04'
    >>> bad_probability(3.0, 2.0, k=2) >= bad_probability(3.0, 2.0, k=1)
    True
    """
    units = tau * _UNIT
    if units != math.floor(units) or units <= k * _UNIT:
        raise ValueError(f"the threshold {tau} must be on the grid and above {k}")
    t, m = scale * _UNIT, int(units)
    one = _tail(m - _UNIT, t)
    return max(_tail(m - (k - j + 1) * _UNIT, t) + (j - 1) * one for j in range(1, k + 1))


def threshold(epsilon: float, delta: float, k: int = 1) -> float:
    """The smallest threshold ``tau`` on the grid ``2^-GRID_BITS`` whose
    :func:`bad_probability` is at most ``delta``, for noise of scale ``2k / epsilon``.

    >>> threshold(1.0, 1e-6), threshold(1.0, 1e-9), threshold(0.1, 1e-6)
    (27.24609375, 41.0615234375, 263.4482421875)
    """
    scale = 2.0 * k / epsilon

    def fits(units: int) -> bool:
        return bad_probability(units / _UNIT, scale, k) * (1 + _MARGIN) <= delta

    lo, step = k * _UNIT, _UNIT  # lo never fits; find a hi that does, then bisect
    while not fits(lo + step):
        step *= 2
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi / _UNIT


@dataclass(frozen=True)
class KeysPlan:
    """A key release, decided before any value is read (all of it public).

    Attributes:
        epsilon, delta: what the release is calibrated to (and charged).
        rows_moved: ``k``, the most rows replacing one subject changes.
        scale: ``t = 2k / epsilon``, the discrete Laplace scale on the counts (in counts;
            on the grid ``2^-GRID_BITS``).
        threshold: ``tau`` (on the grid): a key is released when its noisy count is at
            least this.
        bad: :func:`bad_probability` at ``tau`` (at most ``delta``).
        draws: noise values drawn per release (the most keys there can be).
        sampler: the discrete Laplace sampler's plan.
        sampler_tv: the noise's total-variation distance from the ideal, ``draws`` times
            the sampler's per-value bound (charged as a delta on top, as for every release).
    """

    epsilon: float
    delta: float
    rows_moved: int
    scale: float
    threshold: float
    bad: float
    draws: int
    sampler: samplers.LaplacePlan
    sampler_tv: float


def plan_keys(*, epsilon: float, delta: float | None, rows_moved: int, draws: int) -> KeysPlan:
    """Plan a key release at ``(epsilon, delta)``.

    Args:
        epsilon: > 0.
        delta: in ``(0, 1 - e^(-epsilon / (2 rows_moved))]``: the probability of releasing a
            key one subject alone holds.
        rows_moved: the most rows replacing one subject changes (>= 1).
        draws: the most keys the data can hold (its rows, or its keys' public domain).

    Raises:
        InvalidRequestError: a missing, zero or too large delta; an epsilon the sampler
            cannot take.
    """
    if delta is None or isinstance(delta, bool) or not (math.isfinite(delta) and delta > 0):
        raise InvalidRequestError(
            f"keys are released above a threshold, which needs a delta > 0 (the chance of "
            f"releasing a key one person alone holds), got delta={delta!r}: pass delta= "
            "(e.g. 1e-6), or name the keys with keys= to group by public keys"
        )
    most = -math.expm1(-epsilon / (2 * rows_moved))
    if not delta <= most:
        raise InvalidRequestError(
            f"delta={delta!r} is too large for a key release at epsilon {epsilon!r}: it must "
            f"be at most {most:.6g} (1 - e^(-epsilon/2k)); a delta that large protects nothing"
        )
    scale = 2.0 * rows_moved / epsilon
    try:
        units = scale * _UNIT
        sampler = samplers.laplace_plan(units) if units <= samplers.MAX_SCALE else None
    except ArithmeticError:
        sampler = None
    if sampler is None:
        raise InvalidRequestError(
            f"epsilon {epsilon!r} is outside what a key release can be noised at (noise "
            f"scale {scale:.3g} on the counts): use an epsilon between 1e-9 and 20"
        )
    tau = threshold(epsilon, delta, rows_moved)
    bad = bad_probability(tau, scale, rows_moved)
    return KeysPlan(
        epsilon, delta, rows_moved, scale, tau, bad, draws, sampler, draws * sampler.tv_bound
    )


def release_keys(
    keys: npt.NDArray[np.float64],
    counts: npt.NDArray[np.float64],
    plan: KeysPlan,
    *,
    words: samplers.WordSource | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The keys whose noisy count clears the threshold, sorted, with their noisy counts.

    Args:
        keys, counts: every key present in the data (count >= 1) and its count; entries of
            count 0 are padding and never released. At most ``plan.draws`` entries.
        plan: from :func:`plan_keys`.
        words: a stream of uniform 64-bit words (default: freshly seeded from the OS, as
            every release); a seeded one makes a test reproducible.
    """
    keys = np.asarray(keys, dtype=np.float64).reshape(-1)
    counts = np.asarray(counts, dtype=np.float64).reshape(-1)
    n = min(keys.size, plan.draws)
    sampler = plan.sampler
    rows = sampler.word_rows
    if words is None:
        words = samplers.word_source("auto", rows * plan.draws)
    noise = samplers.noise_from_words(sampler, words(rows * plan.draws).reshape(rows, plan.draws))
    # in grid units, exact integers in float64: the comparison is exact
    noisy = counts[:n] * _UNIT + noise[:n].astype(np.float64)
    kept = (counts[:n] >= 1) & (noisy >= plan.threshold * _UNIT)
    order = np.argsort(keys[:n][kept], kind="stable")
    return keys[:n][kept][order] + 0.0, noisy[kept][order] / _UNIT
