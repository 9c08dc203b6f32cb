"""Keys released above a noisy threshold: the threshold's derivation, the frequency of a key
one subject alone holds, neighbours that add a key, and refusals before anything is read.

The claim (docs/privacy.md, "Keys released above a threshold"): a key present in only one of
two neighbouring datasets is released with probability at most delta, and the counts of the
other keys move by at most ``2k`` in L1 (what the noise is calibrated to). The statistical
tests draw the noise from a seeded stream through the node's own sampler, so they cannot
flake, and compare with a binomial bound of 6 standard deviations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpnode.core.dp import keysets
from dpnode.core.engine import Graph, GraphBuilder, plan, run
from dpnode.core.errors import InvalidRequestError
from dpnode.core.privacy import InputSpec
from dpnode.core.privacy.release import ReleasePlan, plan_release, run_release
from dpnode.core.privacy.state import PrivacyTrackingError

X = "dataset:1/zip"


def _graph(n: int, dtype: str = "int64") -> Graph:
    b = GraphBuilder()
    return b.build([b.op("key_counts", b.input(X, dtype, (n,)))])


def _plan(
    n: int,
    epsilon: float,
    delta: float | None,
    subjects: np.ndarray | None = None,
    dtype: str = "int64",
) -> ReleasePlan:
    spec = {X: InputSpec.private(0.0, 99_999.0, subjects)}
    return plan_release(plan(_graph(n, dtype), accurate=True), spec, epsilon=epsilon, delta=delta)


def _words(seed: int) -> keysets.samplers.WordSource:
    return np.random.PCG64DXSM(seed).random_raw  # type: ignore[no-any-return]


def _true_counts(zips: np.ndarray) -> dict[int, int]:
    out = run(plan(_graph(zips.size), accurate=True), {X: zips}).outputs[0]
    return {int(k): int(c) for k, c in out if c > 0}


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 4.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_the_threshold_is_the_smallest_within_delta(k: int, epsilon: float, delta: float) -> None:
    tau = keysets.threshold(epsilon, delta, k)
    scale = 2 * k / epsilon
    assert keysets.bad_probability(tau, scale, k) <= delta
    step = 2.0**-keysets.GRID_BITS
    if tau - step > k:
        assert keysets.bad_probability(tau - step, scale, k) > delta * (1 - 1e-6)


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-6), (0.5, 1e-8), (2.0, 1e-5)])
def test_the_threshold_matches_or_beats_opendps(epsilon: float, delta: float) -> None:
    """OpenDP's privacy map for the same noise (scale 2/epsilon) and replace-one (two keys
    change, by one each): its smallest threshold within delta is never below ours."""
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    domain = dp.map_domain(dp.atom_domain(T=dp.i64), dp.atom_domain(T=dp.i64))
    metric = dp.l01inf_distance(dp.absolute_distance(T=dp.i64))
    ours = keysets.threshold(epsilon, delta)

    def theirs(tau: int) -> float:
        m = dp.m.make_laplace_threshold(domain, metric, scale=2.0 / epsilon, threshold=tau)
        eps, dlt = m.map((2, 2, 1))
        assert eps == pytest.approx(epsilon)
        return float(dlt)

    assert theirs(math.ceil(ours) - 1) > delta  # OpenDP's smallest threshold is at least ours
    assert keysets.bad_probability(ours, 2.0 / epsilon) <= delta


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 0.02), (0.5, 0.005)])
def test_a_key_of_one_row_is_released_at_most_delta_of_the_time(
    epsilon: float, delta: float
) -> None:
    rp = _plan(200_000, epsilon, delta)
    kp = rp.keys.plan if rp.keys is not None else None
    assert kp is not None
    trials = kp.draws
    keys = np.arange(trials, dtype=np.float64)
    released, _ = keysets.release_keys(keys, np.ones(trials), kp, words=_words(7))
    rate = released.size / trials
    p = kp.bad  # exact: P[1 + Z >= tau]
    assert p <= delta
    assert abs(rate - p) <= 6 * math.sqrt(p * (1 - p) / trials)


def test_a_neighbour_that_adds_a_key_shows_it_at_most_delta_of_the_time() -> None:
    """D and D' differ in one row moved from a frequent key to a key no other row holds; the
    new key is released no more often than delta, and the true counts move by 2 (the
    charged L1)."""
    n, epsilon, delta = 400, 1.0, 0.01
    rng = np.random.default_rng(3)
    d = rng.choice([11_111, 22_222, 33_333, 44_444], n)
    d2 = d.copy()
    d2[0] = 77_777  # the adversary's new key
    rp = _plan(n, epsilon, delta)
    assert rp.keys is not None and rp.report.l1 == pytest.approx(2.0)
    a, b = _true_counts(d), _true_counts(d2)
    change = sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))
    assert change == 2 <= rp.report.l1
    keys = np.array(sorted(b), dtype=np.float64)
    counts = np.array([b[int(k)] for k in keys], dtype=np.float64)
    trials, shown = 20_000, 0
    words = _words(11)
    for _ in range(trials):
        out, _noisy = keysets.release_keys(keys, counts, rp.keys.plan, words=words)
        shown += int(77_777.0 in out)
    p = rp.keys.plan.bad
    assert p <= delta
    assert shown / trials <= p + 6 * math.sqrt(p * (1 - p) / trials)


def test_a_subject_of_several_rows_raises_the_noise_and_the_threshold() -> None:
    subjects = np.repeat(np.arange(100), 3)
    rp = _plan(300, 1.0, 1e-6, subjects)
    assert rp.keys is not None
    kp = rp.keys.plan
    assert kp.rows_moved == 3 and kp.scale == pytest.approx(6.0)
    assert rp.report.l1 == pytest.approx(6.0)
    assert kp.threshold == keysets.threshold(1.0, 1e-6, 3) > keysets.threshold(1.0, 1e-6)
    # a subject's three rows moved to three new keys of one row each: all three together
    # show with at most the delta asked
    assert 3 * keysets.bad_probability(kp.threshold, kp.scale, 1) <= kp.bad <= 1e-6


def test_the_release_answers_sorted_keys_and_counts_within_range() -> None:
    zips = np.repeat(np.array([5, 99_000, 123]), [300, 200, 1])
    rp = _plan(zips.size, 1.0, 1e-6)
    done = run_release(rp, {X: zips})
    (answer,) = done.values
    assert answer[:, 0].tolist() == [5.0, 99_000.0]
    assert np.all(np.abs(answer[:, 1] - [300, 200]) <= 60)
    assert done.release.mechanism == "threshold" and done.failure is None


@pytest.mark.parametrize(
    ("dtype", "delta", "error", "match"),
    [
        ("float64", 1e-6, InvalidRequestError, "keys="),
        ("int64", None, InvalidRequestError, "delta"),
        ("int64", 0.0, InvalidRequestError, "delta"),
        ("int64", math.nan, InvalidRequestError, "delta"),
        ("int64", 0.9, InvalidRequestError, "too large"),
    ],
)
def test_refused_from_public_metadata(
    dtype: str, delta: float | None, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _plan(10, 1.0, delta, dtype=dtype)


def test_keys_are_published_on_their_own() -> None:
    b = GraphBuilder()
    x = b.input(X, "int64", (10,))
    g = b.build([b.op("key_counts", x), b.op("sum", x)])
    with pytest.raises(PrivacyTrackingError, match="on their own"):
        plan_release(
            plan(g, accurate=True),
            {X: InputSpec.private(0.0, 9.0, None)},
            epsilon=1.0,
            delta=1e-6,
        )
