"""Exact CDFs of the ideal noise distributions, a chi-square goodness-of-fit test, and the
z-scores of neighbouring laws' log-ratios.

Every statistical assertion on unseeded noise fails by chance with some probability; the
suite keeps each test's below 1e-5 a run. ``ALPHA`` is the false-failure rate of one
assertion; an assertion over many bins divides it among them (Bonferroni).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy import stats

#: The chance that one statistical assertion fails on a correct sampler, per run.
ALPHA = 1e-6
Floats = npt.NDArray[np.float64]
Cdf = Callable[[Floats], Floats]


def laplace_cdf(t: float) -> Cdf:
    """CDF of the discrete Laplace P(z) ∝ exp(-|z|/t) at integer points (closed form)."""
    p = math.exp(-1.0 / t)

    def cdf(z: Floats) -> Floats:
        z = np.asarray(z, dtype=np.float64)
        below = np.exp(np.minimum(z, 0.0) / t) / (1 + p)  # p^|z| / (1+p) for z < 0
        above = 1.0 - np.exp(-(np.maximum(z, 0.0) + 1.0) / t) / (1 + p)
        return np.where(z < 0, below, above)

    return cdf


def laplace_edges(t: float, bins: int) -> Floats:
    """Bin edges at (continuous-approximation) quantiles of a Laplace of scale t."""
    q = np.linspace(0, 1, bins + 1)[1:-1]
    return np.where(q < 0.5, t * np.log(2 * q), -t * np.log(2 * (1 - q)))


def gaussian_cdf(s: float) -> Cdf:
    """CDF of the discrete Gaussian P(z) ∝ exp(-z²/2s²) at integer points.

    Summed in float64 for s <= 5000; above, the continuous normal CDF at z + 1/2, which differs
    from it by less than 10^-10 at these scales (Poisson summation: exp(-2π²s²) terms).
    """
    if s <= 5000:
        half = math.ceil(15 * s) + 2
        support = np.arange(-half, half + 1, dtype=np.float64)
        pmf = np.exp(-(support**2) / (2 * s * s))
        cum = np.cumsum(pmf / pmf.sum())

        def exact(z: Floats) -> Floats:
            idx = np.asarray(z, dtype=np.int64) + half
            return np.where(idx < 0, 0.0, cum[np.clip(idx, 0, 2 * half)])

        return exact

    def smooth(z: Floats) -> Floats:
        return np.asarray(stats.norm.cdf((np.asarray(z, dtype=np.float64) + 0.5) / s))

    return smooth


def gaussian_edges(s: float, bins: int) -> Floats:
    return np.asarray(stats.norm.ppf(np.linspace(0, 1, bins + 1)[1:-1]) * s)


def chi_square_pvalue(samples: npt.NDArray[np.int64], cdf: Cdf, edges: Floats) -> float:
    """Chi-square test of integer samples against a CDF, on bins (e_{i-1}, e_i] at the edges."""
    cuts = np.unique(np.round(edges))
    probs = np.diff(np.concatenate([[0.0], cdf(cuts), [1.0]]))
    observed = np.bincount(np.searchsorted(cuts, samples, side="left"), minlength=cuts.size + 1)
    expected = probs * samples.size
    keep = expected > 0
    assert expected[keep].min() >= 5, "bins too thin for a chi-square test"
    assert observed[~keep].sum() == 0, "samples fell where the ideal distribution has no mass"
    stat = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    return float(stats.chi2.sf(stat, int(keep.sum()) - 1))


def bonferroni_z(alpha: float, tests: int) -> float:
    """The one-sided normal quantile that any of ``tests`` standard normal scores exceeds with
    probability at most ``alpha`` (Bonferroni: each gets ``alpha / tests``).

    >>> round(bonferroni_z(1e-6, 1), 2), round(bonferroni_z(1e-6, 40), 2)
    (4.75, 5.45)
    """
    return float(stats.norm.isf(alpha / tests))


def log_ratios(a: Floats, c: Floats) -> tuple[Floats, Floats]:
    """The log-ratio ``log(a / c)`` of two histograms' counts, bin by bin, and its standard
    error ``sqrt(1/a + 1/c)`` (delta method on Poisson counts; near-normal for counts in the
    thousands, so a few standard errors bound it).

    >>> r, se = log_ratios(np.array([4000.0]), np.array([1000.0]))
    >>> round(float(r[0]), 4), round(float(se[0]), 4)
    (1.3863, 0.0354)
    """
    return np.log(a / c), np.sqrt(1.0 / a + 1.0 / c)
