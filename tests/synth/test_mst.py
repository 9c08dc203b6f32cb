"""MST's private steps (dpnode.core.synth.mst): the law of the released counts' noise, the
sensitivities the plan claims, tried on every neighbour of small tables, and what it charges."""

from __future__ import annotations

import itertools
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpnode.core.dp import accounting
from dpnode.core.dp.samplers import word_source
from dpnode.core.dp.selection import permute_and_flip
from dpnode.core.errors import InvalidRequestError
from dpnode.core.synth import domain, mst
from dpnode.core.synth.domain import Attribute, ColumnFacts
from tests.dp.stats import (
    ALPHA,
    bonferroni_z,
    chi_square_pvalue,
    gaussian_cdf,
    gaussian_edges,
)
from tests.dp.test_selection import _permute_and_flip


def _attrs(*sizes: int) -> tuple[Attribute, ...]:
    return tuple(Attribute(f"a{i}", "int64", s, 0.0, s - 1.0, None) for i, s in enumerate(sizes))


def _table(sizes: tuple[int, ...], rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, s, rows) for s in sizes], axis=1)


def test_the_released_counts_noise_is_the_receipts_discrete_gaussian() -> None:
    """Many releases of the same counts: the noise is the discrete Gaussian of the sigma the
    receipt states (chi-square on its exact CDF), centred, of variance sigma^2."""
    plan = mst.plan_mst(_attrs(2, 3), rows=30, epsilon=1.0, delta=1e-6)
    codes = _table((2, 3), 30, 0)
    counts = np.concatenate([mst.marginal(codes[:, [j]], [s]) for j, s in enumerate((2, 3))])
    noise = np.concatenate(
        [mst.measure(counts, plan.one_way) - counts for _ in range(4000)]
    ).astype(np.int64)
    assert plan.one_way.grid_exponent == 0  # integers: counts on the grid 1, not rounded
    sigma = plan.one_way.scale
    assert chi_square_pvalue(noise, gaussian_cdf(sigma), gaussian_edges(sigma, 30)) > ALPHA
    assert abs(noise.mean()) < 5 * sigma / np.sqrt(noise.size)
    # n Gaussian draws' sample variance has relative s.e. sqrt(2 / n), 0.01 at n = 20,000:
    # 4.9 s.e. (p <= ALPHA, two-sided) is 4.9%, so a sigma 2.5% off still fails. It was 5%
    # at n = 10,000: 3.5 s.e., p ~ 4e-4 a run.
    tolerance = bonferroni_z(ALPHA / 2, 1) * np.sqrt(2 / noise.size)
    assert abs(noise.var() / sigma**2 - 1) < tolerance, (noise.var(), sigma**2)
    pair = plan.pair_plan(0, 1)
    pair_noise = np.concatenate(
        [
            mst.measure(mst.marginal(codes, [2, 3]), pair) - mst.marginal(codes, [2, 3])
            for _ in range(2000)
        ]
    ).astype(np.int64)
    assert (
        chi_square_pvalue(pair_noise, gaussian_cdf(pair.scale), gaussian_edges(pair.scale, 30))
        > ALPHA
    )


def _neighbours(codes: np.ndarray, sizes: tuple[int, ...]):
    """Every table that replaces one row of ``codes`` with any other row of the domain."""
    for row in range(codes.shape[0]):
        for values in itertools.product(*(range(s) for s in sizes)):
            other = codes.copy()
            other[row] = values
            yield other


def test_every_neighbour_moves_the_marginals_and_scores_within_their_sensitivity() -> None:
    sizes = (2, 2, 3)
    plan = mst.plan_mst(_attrs(*sizes), rows=6, epsilon=1.0, delta=1e-6)
    codes = _table(sizes, 6, 1)
    noisy = mst.run_mst(codes, plan).one_way  # the model the scores compare with: public now
    base = mst.scores(codes, plan, noisy)
    d = len(sizes)
    ones = np.concatenate([mst.marginal(codes[:, [j]], [s]) for j, s in enumerate(sizes)])
    worst_score = worst_one = worst_pair = 0
    for other in _neighbours(codes, sizes):
        moved = np.abs(mst.scores(other, plan, noisy) - base).max()
        worst_score = max(worst_score, int(moved))
        others = np.concatenate([mst.marginal(other[:, [j]], [s]) for j, s in enumerate(sizes)])
        worst_one = max(worst_one, int(((others - ones) ** 2).sum()))
        for a, b in plan.pairs:
            x = mst.marginal(codes[:, [a, b]], [sizes[a], sizes[b]])
            y = mst.marginal(other[:, [a, b]], [sizes[a], sizes[b]])
            worst_pair = max(worst_pair, int(((x - y) ** 2).sum()))
    assert worst_score <= 2 << mst.SCORE_BITS  # the selections' sensitivity
    assert worst_one == 2 * d  # the 1-way release's squared L2 sensitivity, reached
    assert worst_pair == 2  # each 2-way release's
    assert plan.one_way.sensitivity**2 >= 2 * d
    assert plan.pair_plan(0, 1).sensitivity ** 2 >= 2


def _law(scores: np.ndarray, epsilon: float) -> list:
    sensitivity = 2 << mst.SCORE_BITS
    best = int(scores.max())
    weights = [
        mpmath.exp(mpmath.mpf(epsilon) * (int(s) - best) / (2 * sensitivity)) for s in scores
    ]
    return _permute_and_flip(weights)


def test_every_neighbour_keeps_each_selection_within_e_to_its_epsilon() -> None:
    """The exact law of permute-and-flip on the pairs' scores, on a table and on each of its
    neighbours: no pair's probability moves by more than e^epsilon."""
    sizes = (2, 2, 2, 2)
    plan = mst.plan_mst(_attrs(*sizes), rows=5, epsilon=40.0, delta=1e-6)  # visible gaps
    codes = _table(sizes, 5, 2)
    noisy = mst.run_mst(codes, plan).one_way
    eps = plan.select_epsilon
    p = _law(mst.scores(codes, plan, noisy), eps)
    worst = mpmath.mpf(0)
    for other in _neighbours(codes, sizes):
        q = _law(mst.scores(other, plan, noisy), eps)
        worst = max(worst, *(abs(mpmath.log(a / b)) for a, b in zip(p, q, strict=True)))
    assert 0 < worst <= eps * (1 + 1e-12)


def test_the_selection_sampler_follows_permute_and_flip() -> None:
    scores = np.array([0, 3000, 1000, 2500, 4096], dtype=np.int64)
    law = np.array([float(x) for x in _law(scores, 2.0)])
    words = word_source("pcg")
    draws = [
        permute_and_flip(
            scores, epsilon=2.0, sensitivity=Fraction(2 << mst.SCORE_BITS), words=words
        )
        for _ in range(10_000)
    ]
    observed = np.bincount(draws, minlength=scores.size)
    # p > ALPHA = 1e-6 on 10,000 draws (it was 1e-4 on 6,000: a false failure in 10^4)
    assert stats.chisquare(observed, law * 10_000).pvalue > ALPHA


def test_the_charge_depends_on_public_sizes_only_and_fits_the_asked_guarantee() -> None:
    attrs = _attrs(3, 4, 5, 2)
    plan = mst.plan_mst(attrs, rows=1000, epsilon=1.0, delta=1e-6)
    terms = plan.terms()
    # the selections' pure epsilon plus the zCDP of every Gaussian, converted at delta, is
    # the asked epsilon (basic composition), before the samplers' own tiny terms
    pure = plan.select_epsilon * plan.selections
    assert pure == pytest.approx(0.1)
    assert terms.rho == pytest.approx(accounting.calibrate_rho(0.9, 1e-6), rel=1e-12)
    assert pure + accounting.zcdp_to_dp_cks(terms.rho, delta=1e-6) <= 1.0 + 1e-9
    assert 0 < terms.epsilon - pure < 1e-6 and 0 < terms.delta < 1e-12
    # the same whatever the data: the plan reads none
    assert plan.terms() == mst.plan_mst(attrs, rows=1000, epsilon=1.0, delta=1e-6).terms()


@pytest.mark.parametrize("delta", [0.0, 1.0, float("nan")])
def test_a_delta_the_gaussians_cannot_use_is_refused(delta: float) -> None:
    with pytest.raises(InvalidRequestError, match="delta"):
        mst.plan_mst(_attrs(2, 2), rows=10, epsilon=1.0, delta=delta)


def test_numeric_columns_are_binned_over_their_declared_bounds() -> None:
    facts = [
        ColumnFacts("x", "float64", (), -1.0, 1.0),
        ColumnFacts("n", "int32", (), 0.0, 1000.0),
        ColumnFacts("c", "int64", (), 0.0, 2.0, ("a", "b", "c")),
        ColumnFacts("b", "bool", (), 0.0, 1.0),
    ]
    attrs = domain.domain_of(facts, 10_000, {"x": 8})
    assert [a.size for a in attrs] == [8, 32, 3, 2]
    rng = np.random.default_rng(0)
    for a, values in zip(
        attrs,
        [
            rng.uniform(-1, 1, 500),
            rng.integers(0, 1001, 500),
            rng.integers(0, 3, 500),
            rng.random(500) < 0.5,
        ],
        strict=True,
    ):
        codes = domain.encode(a, values)
        assert codes.min() >= 0 and codes.max() < a.size
        back = domain.decode(a, codes, rng)
        assert back.dtype == np.dtype(a.dtype)
        assert (domain.encode(a, back) == codes).all()  # each value back in its own bin
        assert back.min() >= a.lower and back.max() <= a.upper
    with pytest.raises(InvalidRequestError, match="unbounded"):
        domain.domain_of([ColumnFacts("y", "float64", (), 0.0, float("inf"))], 10)
    with pytest.raises(InvalidRequestError, match="per row"):
        domain.domain_of([ColumnFacts("img", "float32", (2, 2), 0.0, 1.0)], 10)
