"""Integer outputs noised on the integers: discrete Laplace / Gaussian with no rounding term.

When the tracker proves every released value is an integer on every dataset within the
bounds, the release uses the grid 1, where rounding is the identity: the noise covers the
query's own sensitivity, not ``floor(Δ₁ / 2^k) + n``. Anything it cannot prove integral keeps
the fine grid, with today's numbers.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from dpnode.core.dp.grid import finest_exponent
from dpnode.core.dp.mechanisms import apply_noise, laplace_scale, plan_gaussian, plan_laplace
from dpnode.core.engine import GraphBuilder, plan
from dpnode.core.privacy.release import ReleasePlan, plan_release, run_release
from tests.dp.stats import (
    ALPHA,
    bonferroni_z,
    chi_square_pvalue,
    laplace_cdf,
    laplace_edges,
    log_ratios,
)
from tests.privacy.helpers import Column

N = 200


def _release(
    graph: Any, cols: dict[str, Column], epsilon: float, delta: float | None = None
) -> ReleasePlan:
    specs = {name: col.spec() for name, col in cols.items()}
    return plan_release(plan(graph, accurate=True), specs, epsilon=epsilon, delta=delta)


def _flags() -> dict[str, Column]:
    return {"flag": Column("bool", (N,), 0, 1)}


def _float_count(b: GraphBuilder) -> int:
    """``flag.float().sum()``: a float32 count, exact (its partial sums are below 2^24)."""
    flag = b.input("flag", "bool", (N,))
    return b.op("sum", b.op("convert_element_type", flag, dtype="float32"))


def _histogram(b: GraphBuilder) -> list[int]:
    """The two counts ``(flag).sum()`` and ``(~flag).sum()``: a replaced row moves one count
    down and the other up, L1 sensitivity 2."""
    flag = b.input("flag", "bool", (N,))
    ones = b.op("convert_element_type", flag, dtype="int64")
    zeros = b.op("sub", 1, ones)
    return [b.op("sum", ones), b.op("sum", zeros)]


def test_an_integer_count_pair_at_epsilon_1_gets_scale_2_on_the_grid_1() -> None:
    b = GraphBuilder()
    rp = _release(b.build(_histogram(b)), _flags(), 1.0)
    # the tracker's 2, widened for its own arithmetic, is taken down to the integer query's:
    # the sum of integer changes is an integer
    assert rp.report.integral and 2.0 < rp.report.l1 < 2.0 + 1e-9
    assert (rp.noise.grid_exponent, rp.noise.scale, rp.noise.sensitivity) == (0, 2.0, 2.0)
    # the fine grid charges floor(2 / 2^-10) + 2 steps of 2^-10: 2.001953125
    fine = plan_laplace(sensitivity_l1=2.0, epsilon=1.0, count=2)
    assert (fine.grid_exponent, fine.scale) == (-10, 2.001953125)
    assert laplace_scale(sensitivity_l1=2.0, epsilon=1.0, count=2, integral=True) == 2.0
    done = run_release(rp, {"flag": np.arange(N) < 70}, rng=np.random.default_rng(0))
    assert all(float(v) == round(float(v)) for v in done.release.values)


def test_a_float_count_is_proven_integral_and_a_gaussian_one_too() -> None:
    b = GraphBuilder()
    rp = _release(b.build([_float_count(b)]), _flags(), 0.5)
    assert rp.report.integral and 1.0 < rp.report.l1 < 1.0 + 1e-9
    assert (rp.noise.grid_exponent, rp.noise.scale) == (0, 2.0)
    b = GraphBuilder()
    rp = _release(b.build(_histogram(b)), _flags(), 1.0, 1e-6)
    # the tracker's sqrt(2), widened for its own arithmetic, is taken down to the integer
    # query's: its squared change is an integer, 2
    assert rp.report.l2 > math.sqrt(2) and rp.noise.grid_exponent == 0
    assert (
        Fraction(rp.noise.sensitivity) ** 2
        >= 2
        > Fraction(rp.noise.sensitivity) ** 2 * (1 - 2.0**-50)
    )
    # rho-zCDP for the query's own L2 sensitivity: Δ₂² <= 2 rho s², s the smallest such float
    d2, two_rho = Fraction(rp.noise.sensitivity) ** 2, 2 * Fraction(rp.noise.rho)
    assert d2 <= two_rho * Fraction(rp.noise.scale) ** 2
    assert d2 > two_rho * Fraction(math.nextafter(rp.noise.scale, 0.0)) ** 2


def test_a_float_mean_and_a_float_sum_keep_the_fine_grid_bit_for_bit() -> None:
    cols = {"x": Column("float64", (N,), 0.0, 1.0)}
    for op, attrs in (("mean", {"dims": (0,)}), ("sum", {})):
        b = GraphBuilder()
        x = b.input("x", "float64", (N,))
        rp = _release(b.build([b.op(op, x, **attrs)]), cols, 1.0)
        assert not rp.report.integral
        today = plan_laplace(sensitivity_l1=rp.report.l1, epsilon=1.0, count=1)
        assert rp.noise.grid_exponent == today.grid_exponent < 0
        assert rp.noise.scale == today.scale and rp.noise.sensitivity == today.sensitivity
        assert rp.noise.grid_exponent == finest_exponent(rp.report.l1, 1, norm=1)
        values = {"x": np.random.default_rng(2).uniform(0, 1, N)}
        done = run_release(rp, values, rng=np.random.default_rng(3))
        assert done.release.grid_exponent == today.grid_exponent
        assert done.release.scale == today.scale
    # the golden numbers of a non-integral plan have not moved
    p = plan_laplace(sensitivity_l1=1.0, epsilon=1.0, count=2)
    assert (p.grid_exponent, p.scale, p.sensitivity) == (-11, 1.0009765625, 2050 / 2048)
    g = plan_gaussian(sensitivity_l2=2.0, count=4, rho=0.5)
    assert g.grid_exponent == -10 and g.sensitivity == 2.001953125


def test_a_publish_with_one_output_not_proven_integral_keeps_the_fine_grid() -> None:
    cols = {**_flags(), "x": Column("float64", (N,), 0.0, 1.0)}
    b = GraphBuilder()
    count = _float_count(b)
    total = b.op("sum", b.input("x", "float64", (N,)))
    rp = _release(b.build([count, total]), cols, 1.0)
    assert [o.integral for o in rp.report.outputs] == [True, False]
    assert not rp.report.integral and rp.noise.grid_exponent is not None
    assert rp.noise.grid_exponent < 0 and rp.noise.sensitivity > rp.report.l1


def test_the_released_noise_of_an_integer_output_is_the_discrete_laplace() -> None:
    # the flags themselves, as integers: each subject moves one of them by 1; at epsilon 0.5
    # the discrete Laplace of t = 2, E|Z| = 2p / (1 - p²) with p = exp(-1/2): 1.9190...
    n = 4000
    b = GraphBuilder()
    flag = b.input("flag", "bool", (n,))
    rp = _release(
        b.build([b.op("convert_element_type", flag, dtype="int64")]),
        {"flag": Column("bool", (n,), 0, 1)},
        0.5,
    )
    assert (rp.noise.grid_exponent, rp.noise.scale) == (0, 2.0)
    truth = np.arange(n) % 3 == 0
    rng = np.random.default_rng(4)
    noise = np.concatenate(
        [run_release(rp, {"flag": truth}, rng=rng).release.values - truth for _ in range(20)]
    )
    assert np.all(noise == np.rint(noise))  # every released value an integer
    p = math.exp(-0.5)
    expected = 2 * p / (1 - p * p)
    # |Z| has variance E[Z²] - E|Z|² = 2p / (1 - p)² - E|Z|²: 5 standard errors of the mean
    se = math.sqrt((2 * p / (1 - p) ** 2 - expected**2) / noise.size)
    assert abs(float(np.mean(np.abs(noise))) - expected) < 5 * se
    assert 5 * se < 2.0 - expected  # the fine grid's continuous E|Z| = 2 would be told apart
    z = noise.astype(np.int64)
    assert chi_square_pvalue(z, laplace_cdf(2.0), laplace_edges(2.0, 40)) > ALPHA


@pytest.mark.parametrize("epsilon", [0.5, 1.0])
def test_neighbouring_counts_release_each_value_within_e_to_the_epsilon(epsilon: float) -> None:
    # an adversarial neighbour: one row's flag flipped, so the count moves by its full
    # sensitivity of 1; every output's probability ratio stays within e^epsilon. The two laws
    # are discrete Laplaces of scale 1/epsilon centred on adjacent integers, so every output's
    # log-ratio is exactly +-epsilon: the test reads each from the node's unseeded sampler
    # with its own standard error.
    b = GraphBuilder()
    rp = _release(b.build([_float_count(b)]), _flags(), epsilon)
    assert rp.noise.grid_exponent == 0
    draws = 1_000_000  # 0.15 s a law (0.03 s at the 200,000 it was)
    flags = np.arange(N) < 50
    neighbour = flags.copy()
    neighbour[N - 1] = True
    laws = []
    for data in (flags, neighbour):
        value = float(np.sum(data))
        noised = apply_noise(np.full(draws, value), _vector(rp.noise.scale, epsilon, draws))
        assert np.all(noised.values == np.rint(noised.values))
        laws.append(noised.values.astype(np.int64))
    lo = min(int(w.min()) for w in laws)
    hist = [np.bincount(w - lo) for w in laws]
    size = min(h.size for h in hist)
    a, c = hist[0][:size].astype(float), hist[1][:size].astype(float)
    enough = (a >= 2000) & (c >= 2000)  # the log-ratio near-normal, s.e. <= 0.032
    assert enough.sum() >= 3  # 18 at epsilon 0.5, 10 at 1 (4 at half the scale at 1)
    r, se = log_ratios(a[enough], c[enough])
    # each output within e^epsilon: a bin's |log-ratio| past epsilon by z s.e., z Bonferroni
    # over the m bins, fails by chance with p <= ALPHA = 1e-6 a run (z ~ 5.3-5.5). It still
    # catches noise too small for the sensitivity: at half the scale every bin's log-ratio is
    # 2 epsilon, >= 15 s.e. past the bound.
    excess = (np.abs(r) - epsilon) / se
    assert excess.max() <= bonferroni_z(ALPHA, r.size), (r, se)
    # and the bound is met, not wasted: the bins' inverse-variance pooled |log-ratio| is
    # epsilon within z s.e. on either side (z ~ 4.9, p <= ALPHA). Its s.e. is ~0.0015, so a
    # scale 3% off either way fails too (measured: 9 to 21 s.e. off)
    weight = 1.0 / se**2
    pooled = float(np.sum(weight * np.abs(r)) / np.sum(weight))
    pooled_se = float(1.0 / np.sqrt(np.sum(weight)))
    assert abs(pooled - epsilon) <= bonferroni_z(ALPHA / 2, 1) * pooled_se, (pooled, pooled_se)


def _vector(scale: float, epsilon: float, count: int) -> Any:
    """The plan of the count's noise for ``count`` independent draws: the same per-value law
    (scale ``1 / epsilon`` on the integers) as the release's, to read it at once."""
    vector = plan_laplace(sensitivity_l1=1.0, epsilon=epsilon, count=count, integral=True)
    assert vector.grid_exponent == 0 and vector.scale == scale
    return vector
