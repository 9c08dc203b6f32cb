"""Selecting quantiles (dpnode.core.dp.selection, permute-and-flip): its distribution, its privacy
on adversarial neighbours, and how close its sampler is to the exact mechanism."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpnode.core.dp import selection
from dpnode.core.dp.samplers import word_source
from dpnode.core.errors import InvalidRequestError
from tests.dp.stats import ALPHA

mpmath.mp.dps = 60
#: The least expected count of a chi-square cell (the rest pooled). At 5, a cell expecting 7
#: reaches 22 with p ~ 4.5e-6 (Poisson), far more often than the chi-square law says: 2e6
#: simulated runs of the tests below failed at p < 1e-6 at rates up to 1.05e-5; at 50, up to
#: 3e-6, with the same power.
LEAST = 50


def _weights(values: np.ndarray, grid: np.ndarray, alpha: float, eps: float, k: float) -> list:
    """Each candidate's acceptance probability, in 60-digit arithmetic, from the definition:
    u(c) = -|(1 - a) #{x < c} - a #{x > c}|, w(c) = exp(eps (u(c) - max u) / (2 k))."""
    a = Fraction(round(alpha * 2**selection.ALPHA_BITS), 2**selection.ALPHA_BITS)
    scores = [-abs((1 - a) * int(np.sum(values < c)) - a * int(np.sum(values > c))) for c in grid]
    best = max(scores)
    return [
        mpmath.exp(
            mpmath.mpf(eps) * mpmath.mpf((s - best).numerator) / (s - best).denominator / (2 * k)
        )
        for s in scores
    ]


def _permute_and_flip(p: list) -> list:
    """The law of permute-and-flip with acceptance probabilities ``p``: candidate j comes at
    a uniform position, after a uniform subset of the others of that size, all rejected:
    P(j) = p_j * mean over t of e_t(1 - p_others) / C(m - 1, t)."""
    m = len(p)
    out = []
    for j in range(m):
        e = [mpmath.mpf(1)] + [mpmath.mpf(0)] * (m - 1)  # elementary symmetric polynomials
        for i in range(m):
            if i != j:
                q = 1 - p[i]
                for t in range(m - 1, 0, -1):
                    e[t] += e[t - 1] * q
        out.append(p[j] * mpmath.fsum(e[t] / mpmath.binomial(m - 1, t) for t in range(m)) / m)
    return out


def _exact(values: np.ndarray, grid: np.ndarray, alpha: float, eps: float, k: float) -> list:
    return _permute_and_flip(_weights(values, grid, alpha, eps, k))


def _draws(values: np.ndarray, grid: np.ndarray, alpha: float, eps: float, k: int, n: int):
    one = selection.Selection(grid, round(alpha * 2**selection.ALPHA_BITS), eps, Fraction(k))
    words = word_source("pcg")
    picks = [selection.select_quantiles(values, one, words=words)[0] for _ in range(n)]
    return np.searchsorted(grid, picks)


@pytest.mark.parametrize(
    ("alpha", "eps", "k"), [(0.5, 1.0, 1), (0.25, 2.0, 1), (0.9, 0.5, 2), (0.5, 8.0, 1)]
)
def test_the_selection_follows_the_exponential_mechanism(alpha: float, eps: float, k: int) -> None:
    rng = np.random.default_rng(7)
    values = np.round(rng.normal(5, 2, 40).clip(0, 10), 1)
    grid = selection.candidates(0.0, 10.0, True)  # 11 integers
    probs = np.array([float(p) for p in _exact(values, grid, alpha, eps, k)])
    # 10,000 draws at p > ALPHA = 1e-6 (it was 6,000 at 1e-4, a false failure in 10^4): a
    # selection at 1.2 epsilon still fails with power >= 0.999
    draws = 10_000
    counts = np.bincount(_draws(values, grid, alpha, eps, k, draws), minlength=grid.size)
    keep = probs * draws >= LEAST  # chi-square on the cells with enough mass, the rest pooled
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(probs[keep], probs[~keep].sum()) * draws
    if expected[-1] < LEAST:
        observed[-2] += observed[-1]
        expected[-2] += expected[-1]
        observed, expected = observed[:-1], expected[:-1]
    if expected.size == 1:  # all the mass on one candidate (a large epsilon)
        assert observed.tolist() == [draws]
    else:
        assert stats.chisquare(observed, expected).pvalue > ALPHA


def test_ties_choose_the_tied_value() -> None:
    # 60% of the values are 3: the median is 3, and at a large epsilon it is always chosen
    values = np.array([1.0] * 20 + [3.0] * 60 + [7.0] * 20)
    grid = selection.candidates(0.0, 10.0, True)
    picks = _draws(values, grid, 0.5, 20.0, 1, 200)
    assert set(grid[picks]) == {3.0}


def test_adversarial_neighbours_stay_within_e_to_the_epsilon() -> None:
    """Replace one value by the other end of the range (the largest move of every count),
    or k values of one subject: every candidate's probability moves by at most e^eps."""
    rng = np.random.default_rng(3)
    grid = selection.candidates(0.0, 20.0, True)
    for alpha in (0.1, 0.5, 0.75):
        for k in (1, 3):
            for _ in range(5):
                d1 = rng.integers(0, 21, 30).astype(np.float64)
                d2 = d1.copy()
                rows = rng.choice(30, k, replace=False)
                d2[rows] = np.where(d1[rows] < 10, 20.0, 0.0)
                p1, p2 = _exact(d1, grid, alpha, 1.0, k), _exact(d2, grid, alpha, 1.0, k)
                worst = max(max(a / b, b / a) for a, b in zip(p1, p2, strict=True))
                assert worst <= mpmath.e**1.0 * (1 + mpmath.mpf(10) ** -40)


def test_the_sampler_is_within_its_charged_distance_of_the_exact_mechanism() -> None:
    """The sampler's exact law (permute-and-flip with its integer coins) against the
    60-digit one, on a grid of 65 candidates."""
    rng = np.random.default_rng(5)
    values = rng.uniform(0, 1, 500)
    grid = selection.candidates(0.0, 64.0, True) / 64
    units, whole = None, 2**selection.ALPHA_BITS
    for alpha, eps in ((0.5, 1.0), (0.3, 0.01), (0.95, 50.0)):
        exact_p = _weights(values, grid, alpha, eps, 1)
        # the sampler's coins, exactly as select_quantiles forms them
        units = round(alpha * whole)
        less = np.array([np.sum(values < c) for c in grid])
        greater = np.array([np.sum(values > c) for c in grid])
        scores = np.abs((whole - units) * less - units * greater)
        gaps = (scores - scores.min()).astype(np.float64)
        w = np.exp(-(eps / (2.0 * whole)) * gaps)
        coins = [mpmath.mpf(int(t)) / 2**62 for t in np.floor(np.ldexp(w, 62)).astype(np.int64)]
        ideal, sampled = _permute_and_flip(exact_p), _permute_and_flip(coins)
        tv = mpmath.fsum(abs(a - b) for a, b in zip(ideal, sampled, strict=True)) / 2
        assert tv <= selection.sampler_tv(grid.size)


def test_the_counts_match_a_direct_count() -> None:
    rng = np.random.default_rng(11)
    values = np.round(rng.uniform(-3, 3, 300), 1)
    grid = selection.candidates(-3.0, 3.0, False)
    less, greater = (c[0] for c in selection._counts(values, grid))
    assert less.tolist() == [int(np.sum(values < c)) for c in grid]
    assert greater.tolist() == [int(np.sum(values > c)) for c in grid]


def test_candidates() -> None:
    assert selection.candidates(2.0, 2.0, False).tolist() == [2.0]
    assert selection.candidates(0.5, 0.7, True).tolist() == [0.5, 0.7]  # no integer inside
    wide = selection.candidates(0, 10**6, True)
    assert wide.size == selection.CANDIDATES and wide[0] == 0 and wide[-1] == 10**6
    huge = selection.candidates(-1e308, 1e308, False)
    assert np.all(np.isfinite(huge)) and np.all(np.diff(huge) >= 0)
    with pytest.raises(Exception, match="finite public range"):
        selection.candidates(0.0, math.inf, False)


def test_bad_parameters_are_refused() -> None:
    grid = selection.candidates(0.0, 1.0, False)
    with pytest.raises(InvalidRequestError, match="epsilon"):
        selection.plan_selection(epsilon=-1.0, outputs=[(grid, [0.5], 1, 0)])
    with pytest.raises(InvalidRequestError, match="epsilon"):
        selection.plan_selection(epsilon=math.nan, outputs=[(grid, [0.5], 1, 0)])
    with pytest.raises(InvalidRequestError, match=r"\[0, 1\]"):
        selection.plan_selection(epsilon=1.0, outputs=[(grid, [1.5], 1, 0)])


def test_the_epsilon_is_shared_by_the_quantiles_and_groups_move_together() -> None:
    grid = selection.candidates(0.0, 1.0, False)
    plan = selection.plan_selection(
        epsilon=1.0,
        outputs=[(grid, [0.25, 0.75], 1, 0), (grid, [0.5, 0.9], 2, 10), (grid, [0.9], 1, 1)],
    )
    assert [x.epsilon for x in plan.selections] == [pytest.approx(0.2)] * 5
    # a moved value leaves one group (its score moves by alpha or 1 - alpha) and enters
    # another (the same): 2 max(alpha, 1 - alpha) per value, 1 for the median or one group
    assert [float(x.sensitivity) for x in plan.selections] == [
        1,
        1,
        2,
        pytest.approx(2 * 2 * 0.9),
        1,
    ]
    assert plan.count == 1 + 1 + 10 + 10 + 1 and plan.grouped == (False, True, True)


def _exact_grouped(values, groups, count, grid, alpha, eps, spread) -> list:
    """Per group, the exact probabilities of its selection (the groups draw independently)."""
    return [_exact(values[groups == g], grid, alpha, eps, spread) for g in range(count)]


def test_a_grouped_selection_follows_the_exponential_mechanism_per_group() -> None:
    rng = np.random.default_rng(9)
    values = np.round(rng.uniform(0, 10, 60))
    groups = rng.integers(-1, 3, 60)  # -1: in no group
    grid = selection.candidates(0.0, 10.0, True)
    one = selection.Selection(
        grid, round(0.5 * 2**selection.ALPHA_BITS), 2.0, Fraction(2), groups=3
    )
    words = word_source("pcg")
    draws = 5000  # at ALPHA / 3 a group (Bonferroni); it was 3000 at 1e-4 a group, 3e-4 a run
    picks = np.stack(
        [selection.select_quantiles(values, one, words=words, groups=groups) for _ in range(draws)]
    )
    for g, probs in enumerate(_exact_grouped(values, groups, 3, grid, 0.5, 2.0, 2)):
        p = np.array([float(x) for x in probs])
        counts = np.bincount(np.searchsorted(grid, picks[:, g]), minlength=grid.size)
        keep = p * draws >= LEAST
        observed = np.append(counts[keep], counts[~keep].sum())
        expected = np.append(p[keep], p[~keep].sum()) * draws
        if expected[-1] < LEAST:
            observed[-2] += observed[-1]
            expected[-2] += expected[-1]
            observed, expected = observed[:-1], expected[:-1]
        assert stats.chisquare(observed, expected).pvalue > ALPHA / 3, g


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_moving_a_value_between_groups_stays_within_e_to_the_epsilon(alpha: float) -> None:
    """A replaced row changes its value and its group: two groups' selections move, and
    calibrated as planned the joint law of all the groups' answers moves by at most
    e^epsilon. The claim behind it: the groups' scores move by at most the planned
    sensitivity together, and some neighbour moves them by exactly that."""
    rng = np.random.default_rng(4)
    grid = selection.candidates(0.0, 4.0, True)
    eps = 4.0
    plan = selection.plan_selection(epsilon=eps, outputs=[(grid, [alpha], 1, 2)])
    (one,) = plan.selections
    moved_most = Fraction(0)
    for _ in range(300):
        n = int(rng.integers(2, 7))
        v1 = rng.integers(0, 5, n).astype(np.float64)
        g1 = rng.integers(0, 2, n)
        v2, g2 = v1.copy(), g1.copy()
        row = rng.integers(n)
        v2[row], g2[row] = rng.integers(0, 5), rng.integers(0, 2)
        e1, e2 = one.epsilon, float(one.sensitivity)
        p1 = _exact_grouped(v1, g1, 2, grid, alpha, e1, e2)
        p2 = _exact_grouped(v2, g2, 2, grid, alpha, e1, e2)
        # the joint law is the product: its worst ratio is the product of the worst ratios
        worst = mpmath.mpf(1)
        for a, b in zip(p1, p2, strict=True):
            worst *= max(max(x / y for x, y in zip(a, b, strict=True)), 1)
        assert worst <= mpmath.e**eps * (1 + mpmath.mpf(10) ** -40)
        a = Fraction(one.alpha, 2**selection.ALPHA_BITS)
        moved = sum(
            max(abs(_score(v1[g1 == g], c, a) - _score(v2[g2 == g], c, a)) for c in grid)
            for g in range(2)
        )
        assert moved <= one.sensitivity
        moved_most = max(moved_most, moved)
    assert moved_most == one.sensitivity


def _score(values: np.ndarray, c: float, a: Fraction) -> Fraction:
    return -abs((1 - a) * int(np.sum(values < c)) - a * int(np.sum(values > c)))


@pytest.mark.parametrize("epsilon", [1.0, 0.1, 0.7, 1e-9, 3.3e-300, 1e6])
@pytest.mark.parametrize("count", [1, 3, 7, 49])
def test_the_quantiles_shares_never_add_up_to_more_than_epsilon(epsilon: float, count: int) -> None:
    # epsilon / count rounded to nearest may round up: the shares are rounded down
    grid = selection.candidates(0.0, 1.0, False)
    alphas = [(i + 1) / (count + 1) for i in range(count)]
    sel = selection.plan_selection(epsilon=epsilon, outputs=[(grid, alphas, 1, 0)])
    assert sum(Fraction(s.epsilon) for s in sel.selections) <= Fraction(epsilon)


def test_an_epsilon_too_small_to_share_is_refused() -> None:
    # the share underflowed to 0 and the plan divided by it: a bare ZeroDivisionError
    grid = selection.candidates(0.0, 1.0, False)
    with pytest.raises(InvalidRequestError, match="too small to share among 2 quantiles"):
        selection.plan_selection(epsilon=5e-324, outputs=[(grid, [0.25, 0.75], 1, 0)])


def _first_by_sorting(high: np.ndarray, low: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """The first accepted candidate in the order that sorts (high, low), ties by index: as
    the selection once computed it, with a full sort per row."""
    order = np.lexsort((low, high), axis=1)
    rows = np.arange(high.shape[0])
    return order[rows, np.argmax(accepted[rows[:, None], order], axis=1)]


@pytest.mark.parametrize("bits", [64, 2, 1])
def test_the_first_accepted_in_order_is_the_sorted_orders(bits: int) -> None:
    """Random keys (with few bits, many ties in one word or both), random acceptances with
    at least one per row, and keys of all ones (which the pick uses to set rejected ones
    aside): the linear-time pick is the sort's, index for index."""
    rng = np.random.default_rng(bits)
    top = np.iinfo(np.uint64).max
    for _ in range(200):
        rows, m = int(rng.integers(1, 4)), int(rng.integers(1, 40))
        shift = np.uint64(64 - bits)
        high = rng.integers(0, top, (rows, m), dtype=np.uint64, endpoint=True) >> shift
        low = rng.integers(0, top, (rows, m), dtype=np.uint64, endpoint=True) >> shift
        high[rng.random((rows, m)) < 0.1] = top
        low[rng.random((rows, m)) < 0.1] = top
        accepted = rng.random((rows, m)) < rng.random()
        accepted[np.arange(rows), rng.integers(0, m, rows)] = True
        expected = _first_by_sorting(high, low, accepted)
        assert selection.first_in_order(high, low, accepted).tolist() == expected.tolist()
