"""The exponential mechanism (McSherry & Talwar 2007), sampled within a charged distance.

Candidate ``c`` of score ``u(c)`` (exact integers, higher is better) whose scores move by at
most ``sensitivity`` between neighbouring datasets is released with probability proportional
to ``w(c) = exp(epsilon (u(c) - u*) / (2 sensitivity))``. Besides ``epsilon``-DP, it has range
``epsilon`` (bounded range), hence is ``epsilon^2 / 8``-zCDP (Cesar & Rogers 2021, Lemma 3.2;
Durfee & Rogers 2019): a quarter of the ``epsilon^2 / 2`` pure DP gives in general, which is
why AIM's rounds select with it. Permute-and-flip (:mod:`.selection`) is never less accurate
at equal epsilon, but no bounded-range or zCDP bound of ``epsilon^2 / 8`` is published for it.

Sampling: the weights are computed in float64 as permute-and-flip's coins are (the best is
exactly 1; one of exponent at most 40 within a relative :data:`~.selection.WEIGHT_ERROR`, one
beyond below ``e^-40`` whatever it is), taken to integers ``q(c) = floor(w(c) 2^62)``, and
the candidate whose cumulative interval holds ``r``, a uniform integer below ``Q = sum q`` is
released. ``r`` is :data:`DRAW_BITS` uniform bits reduced modulo ``Q``: its law is within
``Q 2^-DRAW_BITS`` of uniform, with no loop whose length depends on anything. Since the best
weight is 1, ``sum_c |q(c) / 2^62 - w(c)| <= 2^-45 + m 2^-62 + m e^-40`` bounds the distance of
the normalised laws; with the modulo's, the released candidate's law is within
:func:`sampler_tv` of the exact mechanism's, charged as delta ``(1 + e^epsilon) tv``.
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
from dpnode.core.dp.selection import WEIGHT_ERROR
from dpnode.core.errors import InvalidRequestError

__all__ = ["DRAW_BITS", "exponential_mechanism", "sampler_tv"]

#: uniform bits drawn for the integer that picks the candidate (three 64-bit words)
DRAW_BITS = 192
_WEIGHT_BITS = 62
_SMALL_EXPONENT = 40.0


def sampler_tv(count: int) -> float:
    """Total variation of one draw among ``count`` candidates from the exact exponential
    mechanism (see the module docstring), rounded up.

    >>> 2.8e-14 < sampler_tv(100) < 3e-14
    True
    """
    weights = WEIGHT_ERROR + count * 2.0**-_WEIGHT_BITS + count * math.exp(-_SMALL_EXPONENT)
    modulo = count * 2.0 ** (_WEIGHT_BITS - DRAW_BITS)
    return math.nextafter((weights + modulo) * (1 + 2.0**-40), math.inf)


def exponential_mechanism(
    scores: npt.NDArray[np.int64],
    *,
    epsilon: float,
    sensitivity: Fraction,
    words: samplers.WordSource,
) -> int:
    """The index of one of ``scores`` drawn by the exponential mechanism at ``epsilon``.

    Raises:
        InvalidRequestError: no candidates, a bad epsilon or sensitivity.

    >>> from dpnode.core.dp.samplers import word_source
    >>> exponential_mechanism(np.array([0, 10**9, 3]), epsilon=1.0, sensitivity=Fraction(1),
    ...                       words=word_source())
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
    with np.errstate(under="ignore"):
        weights = np.exp(-factor * gaps)  # the best is exp(0) = 1 exactly
    integers = np.floor(np.ldexp(weights, _WEIGHT_BITS)).astype(np.int64).tolist()
    bounds = list(itertools.accumulate(integers))
    drawn = 0
    for word in words(DRAW_BITS // 64).tolist():
        drawn = drawn << 64 | int(word)
    return bisect.bisect_right(bounds, drawn % bounds[-1])
