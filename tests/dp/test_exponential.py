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
def test_the_samplers_law_is_within_its_charged_distance(epsilon: float) -> None:
    """The sampler's exact law (its integer weights over their sum) against the 60-digit one."""
    rng = np.random.default_rng(3)
    scores = rng.integers(-(10**6), 10**6, 300)
    sensitivity = 1 << 10
    factor = epsilon / (2.0 * sensitivity)
    w = np.exp(-factor * (scores.max() - scores).astype(np.float64))
    integers = [int(q) for q in np.floor(np.ldexp(w, 62)).astype(np.int64)]
    sampled = [mpmath.mpf(q) / sum(integers) for q in integers]
    ideal = _exact(scores.tolist(), epsilon, sensitivity)
    tv = mpmath.fsum(abs(a - b) for a, b in zip(ideal, sampled, strict=True)) / 2
    assert tv <= exponential.sampler_tv(scores.size)


def test_the_uniform_integer_picks_its_interval_and_never_a_zero_weight() -> None:
    scores = np.array([-(10**9), 7, 7], dtype=np.int64)  # the first's weight is 0
    zeros = lambda n: np.zeros(n, dtype=np.uint64)  # noqa: E731  (r = 0)
    pick = exponential.exponential_mechanism(
        scores, epsilon=1.0, sensitivity=Fraction(1), words=zeros
    )
    assert pick == 1
    top = lambda n: np.full(n, 2**64 - 1, dtype=np.uint64)  # noqa: E731  (r = Q - 1 here)
    # 2^192 - 1 modulo 2^63 is 2^63 - 1: the last unit of the second interval
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
    with pytest.raises(InvalidRequestError, match="finite epsilon"):
        exponential.exponential_mechanism(
            one, epsilon=float("nan"), sensitivity=Fraction(1), words=word_source()
        )
    with pytest.raises(InvalidRequestError, match="sensitivity > 0"):
        exponential.exponential_mechanism(
            one, epsilon=1.0, sensitivity=Fraction(0), words=word_source()
        )
