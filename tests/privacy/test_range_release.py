"""Range-aware releases: free post-processing by the public range of every output.

The tracker knows each output's computed values lie in ``[lower, upper]`` (public), and the
release clips them there before the noise. So no subject can move an output by more than
its range's width (the sensitivity is capped there), and a noised value outside the range is
moved to its nearer end: a count stays in ``[0, n]``, a standard deviation stays ``>= 0``, and
the clipped answer is never further from the true value than the noised one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, plan
from dpnode.core.privacy.release import plan_release, run_release
from tests.privacy.helpers import Column

N = 20


def _release(graph: Any, cols: dict[str, Column], epsilon: float, delta: float | None = None):
    specs = {name: col.spec() for name, col in cols.items()}
    return plan_release(plan(graph, accurate=True), specs, epsilon=epsilon, delta=delta)


def test_a_noisy_count_stays_in_its_range_and_never_moves_away_from_the_truth() -> None:
    cols = {"flag": Column("bool", (N,), 0, 1)}
    b = GraphBuilder()
    flag = b.input("flag", "bool", (N,))
    rp = _release(
        b.build([b.op("sum", b.op("convert_element_type", flag, dtype="int64"))]), cols, 0.02
    )
    assert (rp.lower[0], rp.upper[0]) == (0.0, N)  # an integer count: integer ends
    values = {"flag": np.arange(N) < 3}  # a true count of 3, near the lower end
    rng = np.random.default_rng(0)
    released, noised, clipped = [], [], 0
    for _ in range(400):
        done = run_release(rp, values, rng=rng)
        released.append(float(done.values[0]))
        noised.append(float(done.release.values[0]))
        clipped += done.clipped
    released_a, noised_a = np.array(released), np.array(noised)
    assert released_a.min() >= 0 and released_a.max() <= N
    # Laplace of scale 1/0.02 = 50 around 3: most draws leave [0, 20], and are moved back
    outside = int(np.count_nonzero((noised_a < 0) | (noised_a > N)))
    assert clipped == outside > 200
    assert np.all(np.abs(released_a - 3) <= np.abs(noised_a - 3))
    assert np.mean(np.abs(released_a - 3)) < 0.5 * np.mean(np.abs(noised_a - 3))
    assert not np.signbit(released_a).any()  # a clip to the lower end 0 is +0.0


def test_a_standard_deviation_is_never_released_negative() -> None:
    cols = {"x": Column("float64", (N,), 0.0, 1.0)}
    b = GraphBuilder()
    x = b.input("x", "float64", (N,))
    centred = b.op("sub", x, b.op("mean", x, dims=(0,), keepdim=True))
    var = b.op("mean", b.op("mul", centred, centred), dims=(0,))
    rp = _release(b.build([b.op("sqrt", var)]), cols, 0.05)
    assert rp.lower[0] == 0.0
    rng = np.random.default_rng(1)
    values = {"x": np.full(N, 0.5)}  # a standard deviation of 0: half the noise is negative
    out = [float(run_release(rp, values, rng=rng).values[0]) for _ in range(200)]
    assert min(out) >= 0.0 and sum(v == 0.0 for v in out) > 50


@pytest.mark.parametrize("delta", [None, 1e-6])
def test_the_sensitivity_never_exceeds_the_range_s_width(delta: float | None) -> None:
    # sin(500 x) changes by up to 500 |dx| by its Lipschitz bound, but it lies in [-1, 1]:
    # one row moves its element by at most 2 (and the other elements not at all)
    cols = {"x": Column("float64", (N,), 0.0, 1.0)}
    b = GraphBuilder()
    x = b.input("x", "float64", (N,))
    wave = b.op("sin", b.op("mul", x, 500.0))
    rp = _release(b.build([wave]), cols, 1.0, delta)
    assert rp.report.l1 == pytest.approx(2.0) and rp.report.l2 == pytest.approx(2.0)
    # its sum ranges over [-N, N]: the rows' bounds are not the sum's, which is capped at 2N
    b = GraphBuilder()
    x = b.input("x", "float64", (N,))
    total = b.op("sum", b.op("sin", b.op("mul", x, 500.0)), dims=(0,))
    rp = _release(b.build([total]), cols, 1.0, delta)
    assert rp.report.l1 == pytest.approx(2.0)  # one row's element moves it by at most 2


def _gram(b: GraphBuilder, x: Any, y: Any) -> Any:
    return b.op("matmul", b.op("permute", x, dims=(1, 0)), y)


def test_a_symmetric_matrix_is_averaged_with_its_transpose_after_the_noise() -> None:
    """``X.T @ X`` (and a covariance, divided by a scalar) come back symmetric, and the
    averaging halves the off-diagonal noise's variance; ``X.T @ Y`` is left alone."""
    d = 4
    cols = {"x": Column("float64", (N, d), 0.0, 1.0), "y": Column("float64", (N, d), 0.0, 1.0)}
    b = GraphBuilder()
    x, y = b.input("x", "float64", (N, d)), b.input("y", "float64", (N, d))
    cov = b.op("div", _gram(b, x, x), b.constant(np.asarray(float(N - 1))))
    graph = b.build([_gram(b, x, x), cov, _gram(b, x, y), b.op("mul", _gram(b, y, y), 3.0)])
    rp = _release(graph, cols, 1e3)  # a small noise: nothing reaches the ends of the range
    assert rp.symmetric == (True, True, False, True)
    values = {k: np.random.default_rng(1).uniform(0, 1, (N, d)) for k in cols}
    first = run_release(rp, values)
    assert first.symmetrized == 3
    gram, covariance, cross, scaled = first.values
    for m in (gram, covariance, scaled):
        assert np.array_equal(m, m.T)
    assert not np.array_equal(cross, cross.T)
    # the off-diagonal noise: variance 2 b^2 for a Laplace of scale b, halved by averaging
    draws = np.stack([run_release(rp, values).values[0] for _ in range(300)])
    off = draws[:, np.triu_indices(d, 1)[0], np.triu_indices(d, 1)[1]]
    var = float(off.var(axis=0, ddof=1).mean())
    assert 0.8 < var / rp.noise.scale**2 < 1.25, var / rp.noise.scale**2
