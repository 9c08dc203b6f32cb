"""The samplers draw the ideal discrete Laplace / Gaussian, in constant work, from fresh streams."""

from __future__ import annotations

import subprocess
import sys
import time
from decimal import Context, Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from dpnode.core.dp import samplers
from dpnode.core.dp.accounting import GAUSSIAN_ERROR, GAUSSIAN_GAMMA, GAUSSIAN_TV
from dpnode.core.dp.samplers import gaussian_plan, laplace_plan, noise_from_words, sample
from tests.dp.stats import (
    ALPHA,
    chi_square_pvalue,
    gaussian_cdf,
    gaussian_edges,
    laplace_cdf,
    laplace_edges,
)
from tests.dp.test_tables import ONE, implied_weights

N = 400_000
BINS = 400

# Scales cover every code path: top table only, one short digit, one full digit, two digits,
# and the Gaussian with 0, 1 and 2 convolution levels.
LAPLACE_SCALES = [0.7, 2.5, 100.0, 3000.0, 2.0**30 + 12345.5]
GAUSSIAN_SCALES = [0.8, 2.5, 300.0, 700.0, 2.0**18 + 0.25]


@pytest.mark.parametrize("t", LAPLACE_SCALES)
def test_laplace_matches_the_exact_pmf(t: float) -> None:
    z = sample(laplace_plan(t), N)
    assert chi_square_pvalue(z, laplace_cdf(t), laplace_edges(t, BINS)) > ALPHA


@pytest.mark.parametrize("t", LAPLACE_SCALES)
def test_under_noised_laplace_fails_the_same_test(t: float) -> None:
    z = sample(laplace_plan(0.9 * t), N)
    assert chi_square_pvalue(z, laplace_cdf(t), laplace_edges(t, BINS)) < ALPHA


@pytest.mark.parametrize("s", GAUSSIAN_SCALES)
def test_gaussian_matches_the_exact_pmf(s: float) -> None:
    z = sample(gaussian_plan(s), N)
    assert chi_square_pvalue(z, gaussian_cdf(s), gaussian_edges(s, BINS)) > ALPHA


@pytest.mark.parametrize("s", GAUSSIAN_SCALES)
def test_under_noised_gaussian_fails_the_same_test(s: float) -> None:
    z = sample(gaussian_plan(0.9 * s), N)
    assert chi_square_pvalue(z, gaussian_cdf(s), gaussian_edges(s, BINS)) < ALPHA


def test_small_scale_laplace_per_integer() -> None:
    # Bins of single integers where the scale is small: the pmf itself, point by point.
    t = 4.0
    z = sample(laplace_plan(t), N)
    edges = np.arange(-24, 24, dtype=np.float64)
    assert chi_square_pvalue(z, laplace_cdf(t), edges) > ALPHA


def test_ks_on_large_scales() -> None:
    # Kolmogorov-Smirnov against the continuous limit, where the lattice is negligible.
    t, s = 2.0**30, 2.0**30
    lap = sample(laplace_plan(t), N).astype(np.float64)
    assert sps.kstest(lap, sps.laplace(scale=t).cdf).pvalue > ALPHA
    gau = sample(gaussian_plan(s), N).astype(np.float64)
    assert sps.kstest(gau, sps.norm(scale=s).cdf).pvalue > ALPHA
    assert sps.kstest(gau, sps.norm(scale=0.95 * s).cdf).pvalue < ALPHA


@pytest.mark.parametrize("plan", [laplace_plan(3000.0), gaussian_plan(700.0)], ids=["lap", "gau"])
def test_symmetric(plan: samplers.LaplacePlan | samplers.GaussianPlan) -> None:
    z = sample(plan, N)
    # Signs: a binomial test of positive against negative draws.
    pos, neg = int((z > 0).sum()), int((z < 0).sum())
    assert sps.binomtest(pos, pos + neg).pvalue > ALPHA
    # Magnitudes: the positive and the negative halves have the same law.
    assert sps.ks_2samp(z[z > 0], -z[z < 0]).pvalue > ALPHA


def test_tables_never_exceed_their_bounds() -> None:
    for plan in (laplace_plan(2.0**30), gaussian_plan(2.0**18)):
        z = sample(plan, N)
        assert np.abs(z).max() <= plan.max_abs < 2**53


def test_every_call_draws_a_fresh_stream() -> None:
    plan = laplace_plan(1000.0)
    assert not np.array_equal(sample(plan, 64), sample(plan, 64))


def test_two_processes_draw_different_streams() -> None:
    code = (
        "from dpnode.core.dp.samplers import laplace_plan, sample;"
        "print(sample(laplace_plan(1000.0), 64).tobytes().hex())"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.strip()
        for _ in range(2)
    ]
    assert len(runs[0]) == 64 * 16 and runs[0] != runs[1]


def test_os_source_draws_the_same_law() -> None:
    t = 50.0
    z = sample(laplace_plan(t), 100_000, source="os")
    assert chi_square_pvalue(z, laplace_cdf(t), laplace_edges(t, 100)) > ALPHA
    with pytest.raises(ValueError, match="unknown randomness source"):
        samplers.word_source("lcg")  # type: ignore[arg-type]


def test_auto_source_draws_small_samples_from_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default takes a small draw's words from os.urandom, a large one's from PCG64DXSM,
    and both follow the law (many small draws, pooled, against the pmf)."""
    calls: list[int] = []
    real = samplers.os.urandom

    def counting(n: int) -> bytes:
        calls.append(n)
        return real(n)

    monkeypatch.setattr(samplers.os, "urandom", counting)
    t = 50.0
    plan = laplace_plan(t)
    small = samplers.OS_WORDS // plan.word_rows
    z = np.concatenate([sample(plan, small) for _ in range(100_000 // small + 1)])
    assert calls and set(calls) == {8 * small * plan.word_rows}
    assert chi_square_pvalue(z, laplace_cdf(t), laplace_edges(t, 100)) > ALPHA
    calls.clear()
    sample(plan, small + 1)
    assert all(n <= 32 for n in calls)  # a seed at most: the words are the generator's
    calls.clear()
    samplers.word_source("auto")(4)  # a stream of unknown length: the generator's
    assert all(n <= 32 for n in calls)


def _words_for(plan: samplers.LaplacePlan, outcome_bin: int, count: int) -> np.ndarray:
    """Words that all pick `outcome_bin` of the top table and bin 0 of every digit table."""
    lookups = len(plan.tables)
    words = np.zeros((lookups + 1, count), dtype=np.uint64)
    words[0] = np.uint64(outcome_bin) << np.uint64(64 - plan.top.bits)
    return words


def test_work_does_not_depend_on_the_noise_drawn() -> None:
    # The same words pattern except for which top-table bin they hit: one bin whose outcome is
    # zero noise, one whose outcome is the extreme tail. Constant work means equal times.
    plan = laplace_plan(2.0**30)
    top = plan.top
    centre = -top.offset  # index of outcome v = 0
    # With zero low bits and a zero tie word, a bin yields its own outcome iff its threshold
    # is positive (or it is full: alias to itself). Take the farthest such outcome.
    own = [
        b
        for b in range(top.size)
        if int(top.alias[b]) == b or (int(top.th[b]) << 64) + int(top.tl[b]) > 0
    ]
    far = max(own, key=lambda b: abs(b + top.offset))
    count = 1 << 16
    quiet = _words_for(plan, centre, count)
    loud = _words_for(plan, far, count)
    assert np.abs(noise_from_words(plan, quiet.copy())).max() == 0
    assert np.abs(noise_from_words(plan, loud.copy())).min() > 2**35
    times: dict[str, list[float]] = {"quiet": [], "loud": []}
    for _ in range(30):
        for name, words in (("quiet", quiet), ("loud", loud)):
            w = words.copy()
            start = time.perf_counter()
            noise_from_words(plan, w)
            times[name].append(time.perf_counter() - start)
    # Best of 30 (other load only ever adds time), with a generous band for a noisy 2-core
    # machine; a loop whose length followed the noise would differ by orders of magnitude.
    ratio = min(times["loud"]) / min(times["quiet"])
    assert 0.67 < ratio < 1.5, ratio


def test_runtime_is_uncorrelated_with_noise_magnitude() -> None:
    # End to end through the public sampler, with real randomness: single draws, timed.
    plan = laplace_plan(1000.0)
    sample(plan, 1)
    mags, times = [], []
    for _ in range(3000):
        start = time.perf_counter()
        z = sample(plan, 1)
        times.append(time.perf_counter() - start)
        mags.append(abs(int(z[0])))
    mags_a, times_a = np.array(mags), np.array(times)
    small = times_a[mags_a <= np.quantile(mags_a, 0.25)]
    large = times_a[mags_a >= np.quantile(mags_a, 0.75)]
    assert 0.67 < np.median(large) / np.median(small) < 1.5
    assert abs(sps.spearmanr(mags_a, times_a).statistic) < 0.15


def test_plans_refuse_scales_outside_their_range() -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf"), 2.0**45):
        with pytest.raises(ValueError, match="noise scale"):
            laplace_plan(bad)
        with pytest.raises(ValueError, match="noise scale"):
            gaussian_plan(bad)
    with pytest.raises(ValueError, match="count"):
        sample(laplace_plan(1.0), -1)
    assert sample(laplace_plan(1.0), 0).shape == (0,)


# --- The pointwise bound the budget relies on (docs/privacy.md, Lemma 3) --------------------


def _exact_gaussian_pmf(s: float, zs: range) -> dict[int, Decimal]:
    """The ideal discrete Gaussian ``exp(-z²/2s²) / N`` at ``zs``, to 60 digits."""
    with localcontext(Context(prec=60)):
        two_var = 2 * Decimal(s) ** 2
        reach = int(40 * s) + 40
        norm = sum((-(Decimal(z) ** 2) / two_var).exp() for z in range(-reach, reach + 1))
        return {z: (-(Decimal(z) ** 2) / two_var).exp() / norm for z in zs}


def _plan_pmf(plan: samplers.GaussianPlan) -> dict[int, Fraction]:
    """The sampler's exact pmf, from the tables' implied weights (one level at most)."""
    top = implied_weights(plan.top)[: plan.top.size]
    if plan.levels == 0:
        return {i + plan.top.offset: Fraction(w, ONE) for i, w in enumerate(top) if w}
    assert plan.levels == 1 and plan.low is not None
    low = np.array(implied_weights(plan.low)[: plan.low.size], dtype=object)
    m = 1 << 6
    width = (len(top) - 1) * m + len(low)
    total = np.zeros(width, dtype=object)
    for a, w in enumerate(top):
        if w:
            total[a * m : a * m + len(low)] += w * low
    first = plan.top.offset * m + plan.low.offset
    return {first + i: Fraction(int(w), ONE * ONE) for i, w in enumerate(total) if w}


@pytest.mark.parametrize("s", [0.8, 2.5, 300.0, 700.0])
def test_gaussian_pmf_is_pointwise_within_the_plan_s_bound(s: float) -> None:
    # |q(z) - p(z)| <= gamma p(z) + error p(0) at every integer, checked exactly: the tables'
    # weights convolved in integers, against the ideal pmf to 60 digits.
    plan = gaussian_plan(s)
    assert plan.tables_tv <= GAUSSIAN_TV and plan.tv_bound == GAUSSIAN_TV
    q = _plan_pmf(plan)
    reach = max(abs(z) for z in q) + 5
    p = _exact_gaussian_pmf(s, range(-reach, reach + 1))
    with localcontext(Context(prec=60)):
        gamma, error = Decimal(plan.gamma), Decimal(plan.error)
        peak = p[0]
        worst = max(
            abs(Decimal(q.get(z, 0).numerator) / Decimal(q.get(z, 0).denominator) - p[z])
            - gamma * p[z]
            for z in p
        )
    assert worst <= error * peak
    # The bound is not loose by orders of magnitude: the sampler's rounding shows in it.
    assert worst > error * peak / 2**20


def test_every_gaussian_plan_is_within_the_accounting_s_constants() -> None:
    scales = [2.0**k + 0.37 for k in range(-6, 44)] + [511.9, 512.0, 512.1, 2.0**44]
    for s in scales:
        plan = gaussian_plan(s)
        assert plan.tables_tv <= GAUSSIAN_TV and plan.tv_bound == GAUSSIAN_TV
        assert plan.gamma <= GAUSSIAN_GAMMA and plan.error <= GAUSSIAN_ERROR


def test_each_gaussian_lookup_has_its_own_tie_breaking_word() -> None:
    plan = gaussian_plan(700.0)
    assert plan.word_rows == 2 * len(plan.tables) == 4
    assert laplace_plan(3000.0).word_rows == len(laplace_plan(3000.0).tables) + 1
    words = np.zeros((4, 8), dtype=np.uint64)
    assert noise_from_words(plan, words.copy()).shape == (8,)
    with pytest.raises(ValueError, match=r"shape \(4, count\)"):
        noise_from_words(plan, np.zeros((3, 8), dtype=np.uint64))
    # Two lookups that both tie their thresholds break the ties with different words: the
    # second lookup's tie-breaking word moves its outcome and nothing else.
    low = plan.low
    assert low is not None
    split = next(b for b in range(1 << low.bits) if int(low.alias[b]) != b and int(low.tl[b]) > 0)
    words[2] = (np.uint64(split) << np.uint64(64 - low.bits)) | np.uint64(int(low.th[split]))
    below, above = words.copy(), words.copy()
    below[3], above[3] = np.uint64(0), np.uint64(2**64 - 1)
    assert set(noise_from_words(plan, below) - noise_from_words(plan, above)) == {
        split - int(low.alias[split])
    }
