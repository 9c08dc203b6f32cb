"""The exponential mechanism (McSherry & Talwar 2007), sampled within a charged distance.

Candidate ``c`` of score ``u(c)`` (exact integers, higher is better) whose scores move by at
most ``sensitivity`` between neighbouring datasets is released with probability proportional
to ``w(c) = exp(epsilon (u(c) - u*) / (2 sensitivity))``. Besides ``epsilon``-DP, it has range
``epsilon`` (bounded range), hence is ``epsilon^2 / 8``-zCDP (Cesar & Rogers 2021, Lemma 3.2;
Durfee & Rogers 2019): a quarter of the ``epsilon^2 / 2`` pure DP gives in general, which is
why AIM's rounds select with it. Permute-and-flip (:mod:`.selection`) is never less accurate
at equal epsilon, but no bounded-range or zCDP bound of ``epsilon^2 / 8`` is published for it.

Sampling, and what it costs (``docs/privacy.md``, "The exponential mechanism's sampler"):
the exponent ``x(c) = f (u* - u(c))`` is computed in float64 with ``f`` rounded down (so the
mechanism approximated is the exact one at some ``f <= epsilon / (2 sensitivity)``), each
weight ``exp(-x(c))`` taken exactly to the integer ``q(c) = floor(2^192 exp(-x(c)))`` (the
best's is ``2^192``), and the candidate whose cumulative interval holds ``r``, 384 uniform bits
modulo ``Q = sum q``, released: no loop, the same work whatever the scores and the draw. For
neighbours, on the candidates ``G`` whose exponents are at most ``40 + epsilon`` on both, every
weight the sampler uses is the exact one within a relative :data:`WEIGHT_ERROR` (the exponent's
two roundings times at most 90, ``exp``'s few ulps, the modulo's ``2^-172``; a weight there is
at least ``2^-139``, so ``2^192`` of it is an integer), and outside ``G`` (exponents above 40 on
``D``, since an exponent moves by at most ``epsilon``) the sampler puts at most ``m e^-40 (1 +
3 WEIGHT_ERROR)``. The exact mechanism restricted to ``G`` has range ``epsilon`` too, hence
``D_alpha <= alpha epsilon^2 / 8``; the sampler's law on ``G``, renormalised, is within the
factor ``k = (1 + WEIGHT_ERROR) / (1 - WEIGHT_ERROR)`` of it pointwise, which adds at most
``(2 + 1 / (alpha - 1)) log k <= 18 log k`` to ``D_alpha`` at the filter's orders: each
selection is a step of ``(xi, epsilon^2 / 8, delta)`` (:func:`selection_terms`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import samplers
from dpnode.core.dp.mechanisms import float_at_least
from dpnode.core.errors import InvalidRequestError

__all__ = ["MAX_EPSILON", "WEIGHT_ERROR", "exponential_mechanism", "selection_terms"]

#: the largest epsilon sampled (its weights' exponents on ``G`` stay within 90)
MAX_EPSILON = 50.0
#: a weight's relative error on ``G`` (see the module docstring), rounded up
WEIGHT_ERROR = 2.0**-43
_WEIGHT_BITS = 192
_DRAW_WORDS = 6  # 384 bits
_SMALL_EXPONENT = 40.0


def selection_terms(epsilon: float, count: int) -> tuple[float, float]:
    """What one selection's sampler adds to its ``epsilon^2 / 8`` of rho, among ``count``
    candidates: a pure ``xi`` and a ``delta`` (see the module docstring), rounded up; ``delta``
    is ``inf`` beyond :data:`MAX_EPSILON` (no budget covers it).

    >>> xi, delta = selection_terms(0.1, 100)
    >>> xi < 1e-11, 4.2e-16 < delta < 4.3e-16
    (True, True)
    """
    k = math.log1p(2 * WEIGHT_ERROR / (1 - WEIGHT_ERROR))
    xi = math.nextafter(18 * k * (1 + 2.0**-40), math.inf)
    if not epsilon <= MAX_EPSILON:
        return xi, math.inf
    delta = count * math.exp(-_SMALL_EXPONENT) * (1 + 3 * WEIGHT_ERROR)
    return xi, math.nextafter(delta * (1 + 2.0**-40), math.inf)


def exponential_mechanism(
    scores: npt.NDArray[np.int64],
    *,
    epsilon: float,
    sensitivity: Fraction,
    words: samplers.WordSource,
) -> int:
    """The index of one of ``scores`` drawn by the exponential mechanism at ``epsilon``.

    Raises:
        InvalidRequestError: no candidates, a bad epsilon (above :data:`MAX_EPSILON` too)
            or sensitivity.

    >>> from dpnode.core.dp.samplers import word_source
    >>> exponential_mechanism(np.array([0, 10**9, 3]), epsilon=1.0, sensitivity=Fraction(1),
    ...                       words=word_source())
    1
    """
    if scores.ndim != 1 or scores.size == 0:
        raise InvalidRequestError("a selection needs at least one candidate")
    if not (0 < epsilon <= MAX_EPSILON) or sensitivity <= 0:
        raise InvalidRequestError(
            f"a selection needs an epsilon in (0, {MAX_EPSILON:g}] and a sensitivity > 0, got "
            f"{epsilon!r} and {sensitivity}"
        )
    exact = scores.astype(object)  # Python integers: no overflow in the differences
    gaps = np.array([float(g) for g in exact.max() - exact], dtype=np.float64)
    # rounded down: the mechanism approximated is the exact one at an epsilon at most asked
    factor = math.nextafter(epsilon / (2.0 * float_at_least(sensitivity)), 0.0)
    with np.errstate(under="ignore"):
        weights = np.exp(-factor * gaps)  # the best is exp(0) = 1 exactly
    integers = [int(w) for w in np.ldexp(weights, _WEIGHT_BITS).tolist()]
    bounds = list(itertools.accumulate(integers))
    drawn = 0
    for word in words(_DRAW_WORDS).tolist():
        drawn = drawn << 64 | int(word)
    return bisect.bisect_right(bounds, drawn % bounds[-1])
