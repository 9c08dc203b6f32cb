"""The exponential mechanism's sampler (dpnode.core.dp.exponential): its law against the exact
one, in draws and in 60-digit arithmetic, and how it maps its uniform integer to a candidate."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpnode.core.dp import exponential
from dpnode.core.dp.samplers import word_source
from dpnode.core.errors import InvalidRequestError
from tests.dp.stats import ALPHA

mpmath.mp.dps = 60


def _exact(scores: list[int], epsilon: float, sensitivity: int) -> list:
    best = max(scores)
    w = [mpmath.exp(mpmath.mpf(epsilon) * (s - best) / (2 * sensitivity)) for s in scores]
    return [x / mpmath.fsum(w) for x in w]


def test_draws_follow_the_exponential_mechanism() -> None:
    scores = np.array([0, 3, 5, 6, 9, 9, 20], dtype=np.int64)
    p = [float(x) for x in _exact(scores.tolist(), 1.0, 2)]
    words = word_source()
    draws = [
        exponential.exponential_mechanism(scores, epsilon=1.0, sensitivity=Fraction(2), words=words)
        for _ in range(20_000)
    ]
    seen = np.bincount(draws, minlength=scores.size)
    assert stats.chisquare(seen, np.array(p) * len(draws)).pvalue > ALPHA


@pytest.mark.parametrize("epsilon", [0.01, 1.0, 50.0])
def test_the_samplers_weights_are_within_their_charged_error(epsilon: float) -> None:
    """The sampler's integer weights against the 60-digit ones: within a relative
    WEIGHT_ERROR where the exponent is at most 40 + epsilon, and the mass beyond 40 within
    the charged delta."""
    rng = np.random.default_rng(3)
    sensitivity = 1 << 10
    scores = rng.integers(-(10**5), 10**5, 300)
    scores[:50] = scores.max() - rng.integers(0, int(60 * 2 * sensitivity / epsilon), 50)
    factor = np.nextafter(epsilon / (2.0 * sensitivity), 0.0)
    w = np.exp(-factor * (scores.max() - scores).astype(np.float64))
    integers = [int(q) for q in np.ldexp(w, 192).tolist()]
    exact = [mpmath.mpf(factor) * int(scores.max() - s) for s in scores.tolist()]
    beyond = mpmath.mpf(0)
    for q, x in zip(integers, exact, strict=True):
        if x <= 40 + epsilon:
            ideal = mpmath.exp(-x)
            assert abs(mpmath.mpf(q) / 2**192 - ideal) <= exponential.WEIGHT_ERROR * ideal
        if x > 40:
            beyond += mpmath.mpf(q) / sum(integers)
    assert beyond <= exponential.selection_terms(epsilon, scores.size)[1]


def test_the_uniform_integer_picks_its_interval_and_never_a_zero_weight() -> None:
    scores = np.array([-(10**9), 7, 7], dtype=np.int64)  # the first's weight is 0
    zeros = lambda n: np.zeros(n, dtype=np.uint64)  # noqa: E731  (r = 0)
    pick = exponential.exponential_mechanism(
        scores, epsilon=1.0, sensitivity=Fraction(1), words=zeros
    )
    assert pick == 1
    top = lambda n: np.full(n, 2**64 - 1, dtype=np.uint64)  # noqa: E731
    # 2^384 - 1 modulo 2^193 is 2^193 - 1: the last unit of the second interval
    pick = exponential.exponential_mechanism(
        scores, epsilon=1.0, sensitivity=Fraction(1), words=top
    )
    assert pick == 2


def test_bad_parameters_are_refused() -> None:
    one = np.array([1], dtype=np.int64)
    with pytest.raises(InvalidRequestError, match="at least one candidate"):
        exponential.exponential_mechanism(
            np.array([], dtype=np.int64), epsilon=1.0, sensitivity=Fraction(1), words=word_source()
        )
    with pytest.raises(InvalidRequestError, match="an epsilon in"):
        exponential.exponential_mechanism(
            one, epsilon=float("nan"), sensitivity=Fraction(1), words=word_source()
        )
    with pytest.raises(InvalidRequestError, match="an epsilon in"):
        exponential.exponential_mechanism(
            one, epsilon=51.0, sensitivity=Fraction(1), words=word_source()
        )
    with pytest.raises(InvalidRequestError, match="sensitivity > 0"):
        exponential.exponential_mechanism(
            one, epsilon=1.0, sensitivity=Fraction(0), words=word_source()
        )
