"""OpenDP's side: each statistic from OpenDP 0.16's constructors, for a replaced row.

OpenDP's polars front end (``dp.Context``) is not used: OpenDP 0.16 pins polars 1.36.1 and
refuses to run a plan made by another polars ("Installed python polars version ... !=
expected version"), and the environment's polars is 2.x. Its constructors need no polars.

Every measurement takes a sized vector domain (the row count is public, as in dpnode) with the
symmetric distance, and is calibrated so that ``map(REPLACE_ONE)``, a replaced row, is the
row's epsilon (:func:`calibrate`). Where a statistic is several
measurements, :class:`Sequential` and :class:`Parallel` say what they cost together:
sequential parts add up; disjoint groups of rows (unsized: group sizes are private) cost the
most a replaced row can change, either within one group (symmetric distance 2 there) or by
moving from one group to another (1 in each).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpnode.core.dp.selection import candidates as quantile_candidates

#: a replaced row, OpenDP's ``d_in`` on a sized domain: one removal and one addition
REPLACE_ONE = 2


def _dp() -> Any:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


@dataclass(frozen=True)
class OpenDPRelease:
    """An OpenDP measurement, how to make its input from the table's columns (timed with it:
    dpnode's time includes recording its graph) and the post-processing of its output into
    the row's value; calling it releases once."""

    measurement: Any
    prepare: Callable[[], Any]
    post: Callable[[Any], np.ndarray] = np.asarray

    def __call__(self) -> np.ndarray:
        return self.post(self.measurement(self.prepare()))


@dataclass(frozen=True)
class Sequential:
    """Measurements released one after another on their own inputs: the losses add up."""

    parts: Sequence[Any]

    def __call__(self, data: Sequence[Any]) -> list[Any]:
        return [m(x) for m, x in zip(self.parts, data, strict=True)]

    def map(self, d_in: int) -> float:
        return float(sum(m.map(d_in) for m in self.parts))


@dataclass(frozen=True)
class Parallel:
    """One measurement per disjoint group of rows: a replaced row changes one group by 2 or
    two groups by 1 each."""

    groups: Sequence[Any]

    def __call__(self, data: Sequence[Any]) -> list[Any]:
        return [m(x) for m, x in zip(self.groups, data, strict=True)]

    def map(self, d_in: int) -> float:
        if d_in != REPLACE_ONE:
            raise ValueError("only a replaced row is accounted for")
        within = max(m.map(2) for m in self.groups)
        moved = sorted((m.map(1) for m in self.groups), reverse=True)[:2]
        return float(max(within, sum(moved)))


def sized_floats(n: int, bounds: tuple[float, float]) -> tuple[Any, Any]:
    dp = _dp()
    lo, hi = map(float, bounds)
    return dp.vector_domain(dp.atom_domain(bounds=(lo, hi)), size=n), dp.symmetric_distance()


def calibrate(make: Callable[[float], Any], epsilon: float) -> tuple[Any, float]:
    """The measurement ``make(scale)`` whose loss for a replaced row is ``epsilon``, and its
    scale. Every mechanism here loses in inverse proportion to its scale, so the scale is
    read from the loss at scale 1 and then nudged up until OpenDP's own map agrees (its
    rounding is conservative): the scale OpenDP's ``binary_search`` finds, in two or three
    constructions instead of about sixty.
    """
    scale = make(1.0).map(REPLACE_ONE) / epsilon
    for _ in range(64):
        measurement = make(scale)
        if measurement.map(REPLACE_ONE) <= epsilon:
            return measurement, scale
        scale = math.nextafter(scale, math.inf) * (1 + 1e-12)
    raise ArithmeticError(f"no scale found for epsilon {epsilon}")


def laplace(chain: Any, epsilon: float) -> Any:
    """``chain`` followed by Laplace noise of the scale that loses ``epsilon``."""
    dp = _dp()
    return calibrate(lambda s: chain >> dp.m.then_laplace(scale=s), epsilon)[0]


def floats(values: np.ndarray) -> Callable[[], list[float]]:
    return lambda: values.astype(np.float64).tolist()


def ints(values: np.ndarray) -> Callable[[], list[int]]:
    return lambda: values.astype(np.int64).tolist()


def bounded_sum(values: np.ndarray, bounds: tuple[float, float], epsilon: float) -> OpenDPRelease:
    dp = _dp()
    return OpenDPRelease(
        laplace(sized_floats(len(values), bounds) >> dp.t.then_sum(), epsilon), floats(values)
    )


def bounded_mean(values: np.ndarray, bounds: tuple[float, float], epsilon: float) -> OpenDPRelease:
    dp = _dp()
    return OpenDPRelease(
        laplace(sized_floats(len(values), bounds) >> dp.t.then_mean(), epsilon), floats(values)
    )


def bounded_variance(
    values: np.ndarray, bounds: tuple[float, float], epsilon: float
) -> OpenDPRelease:
    dp = _dp()
    return OpenDPRelease(
        laplace(sized_floats(len(values), bounds) >> dp.t.then_variance(), epsilon),
        floats(values),
    )


def counts(k: int, n: int, epsilon: float) -> Any:
    """The noised count of each of ``k`` public categories (codes ``0 .. k-1``): a replaced
    row moves one count down and another up, L1 2."""
    dp = _dp()
    space = dp.vector_domain(dp.atom_domain(T=int), size=n), dp.symmetric_distance()
    return laplace(
        space >> dp.t.then_count_by_categories(categories=list(range(k)), null_category=False),
        epsilon,
    )


def category_counts(codes: np.ndarray, k: int, epsilon: float) -> OpenDPRelease:
    return OpenDPRelease(counts(k, len(codes), epsilon), ints(codes))


def indicator_sum(mask: np.ndarray, epsilon: float) -> OpenDPRelease:
    """How many rows satisfy a predicate: the sum of its 0/1 indicator on a sized domain (a
    replaced row moves it by 1)."""
    return bounded_sum(mask.astype(np.float64), (0.0, 1.0), epsilon)


def histogram(
    values: np.ndarray, bins: int, bounds: tuple[float, float], epsilon: float
) -> OpenDPRelease:
    """Counts of ``bins`` equal bins over the bounds (the last bin closed, as ``torch.histc``)."""
    lo, hi = map(float, bounds)

    def bin_codes() -> list[int]:
        return np.minimum(((values - lo) // ((hi - lo) / bins)).astype(np.int64), bins - 1).tolist()

    return OpenDPRelease(counts(bins, len(values), epsilon), bin_codes)


def top_k(codes: np.ndarray, k: int, top: int, epsilon: float) -> OpenDPRelease:
    """The ``top`` categories by noised count, commonest first: the counts' Laplace (scale
    2 / epsilon) beats OpenDP's ``noisy_top_k`` here, whose scores (``LInfDistance``, not
    monotonic under a replacement) need scale ``2 top / epsilon``."""

    def order(noised: Any) -> np.ndarray:
        return np.argsort(-np.asarray(noised, dtype=float), kind="stable")[:top]

    return OpenDPRelease(counts(k, len(codes), epsilon), ints(codes), order)


def count_distinct(values: np.ndarray, epsilon: float) -> OpenDPRelease:
    """OpenDP's distinct count is 1-stable in the symmetric distance whether or not the size
    is known, so a replaced row costs a sensitivity of 2 (a replacement moves it by 1 at most:
    OpenDP does not use that)."""
    dp = _dp()
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.symmetric_distance()
    return OpenDPRelease(laplace(space >> dp.t.then_count_distinct(), epsilon), ints(values))


def quantile_pick(
    n: int | None, bounds: tuple[float, float], integral: bool, alpha: float, epsilon: float
) -> tuple[Any, np.ndarray]:
    """A quantile selected over dpnode's public candidates (every integer of an integer
    column's bounds, else 4097 points) by OpenDP's candidate scores and noisy max
    (exponential noise, pure DP); ``n`` None is an unsized domain (a group's rows). Returns
    the measurement (its output an index) and the candidates."""
    dp = _dp()
    grid = quantile_candidates(float(bounds[0]), float(bounds[1]), integral)
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n)
    scores = (domain, dp.symmetric_distance()) >> dp.t.then_quantile_score_candidates(
        grid.tolist(), alpha
    )
    pick, _ = calibrate(
        lambda s: scores >> dp.m.then_noisy_max(dp.max_divergence(), scale=s, negate=True),
        epsilon,
    )
    return pick, grid


def quantile(
    values: np.ndarray, bounds: tuple[float, float], integral: bool, alpha: float, epsilon: float
) -> OpenDPRelease:
    pick, grid = quantile_pick(len(values), bounds, integral, alpha, epsilon)
    return OpenDPRelease(pick, floats(values), lambda i: np.array(grid[i]))


def group_extremes(
    values: np.ndarray,
    groups: np.ndarray,
    k: int,
    bounds: tuple[float, float],
    integral: bool,
    epsilon: float,
) -> OpenDPRelease:
    """Each group's minimum and maximum (quantiles 0 and 1), each at half the epsilon of a
    replaced row within its group: ``[min per group, max per group]``."""
    picks = [quantile_pick(None, bounds, integral, a, epsilon / 2) for a in (0.0, 1.0)]
    grid = picks[0][1]
    per_group = Parallel([Sequential([p for p, _ in picks]) for _ in range(k)])

    def prepare() -> list[list[list[float]]]:
        return [[values[groups == g].astype(float).tolist()] * 2 for g in range(k)]

    def post(released: list[list[int]]) -> np.ndarray:
        return np.array([grid[i] for i in np.array(released).T.ravel()])

    return OpenDPRelease(per_group, prepare, post)


def moment_sums(width: int, n: int, norm: float, epsilon: float) -> tuple[Any, float]:
    """OpenDP's Laplace on the column sums of ``n`` rows of ``width``, each of L1 norm at
    most ``norm`` (``then_np_clamp``; a sized domain, so a replaced row changes the sums by
    ``2 * norm``): the measurement and its noise scale."""
    import opendp.prelude as dp
    from opendp.extras.numpy._make_np_sum import then_np_sum

    # the sums of floats are taken as exact, as OpenDP's numpy constructors require
    dp.enable_features("contrib", "idealized-numerics")
    space = dp.numpy.array2_domain(size=n, num_columns=width, T=float)
    summed = (space, dp.symmetric_distance()) >> dp.numpy.then_np_clamp(norm, p=1) >> then_np_sum()
    return calibrate(lambda s: summed >> dp.m.then_laplace(s), epsilon)


def centred(values: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """``values`` mapped from their bounds onto [-1, 1]."""
    lo, hi = map(float, bounds)
    return (values.astype(np.float64) - (lo + hi) / 2) / ((hi - lo) / 2)


def uncentre(u: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    lo, hi = map(float, bounds)
    return (lo + hi) / 2 + (hi - lo) / 2 * u


def group_moments(
    values: np.ndarray,
    groups: np.ndarray,
    k: int,
    bounds: tuple[float, float],
    powers: int,
    epsilon: float,
) -> OpenDPRelease:
    """Per group, the count and the sums of the centred value's powers ``1 .. powers``: each
    row one vector, its group's count and powers (L1 norm at most ``1 + powers``), zero
    elsewhere, summed and noised once. The output is ``(k, 1 + powers)``: count, sums."""
    n = len(values)

    def prepare() -> np.ndarray:
        u = centred(values, bounds)
        rows = np.zeros((n, k, 1 + powers))
        rows[np.arange(n), groups, 0] = 1.0
        for p in range(1, powers + 1):
            rows[np.arange(n), groups, p] = u**p
        return rows.reshape(n, -1)

    measurement, _ = moment_sums(k * (1 + powers), n, 1.0 + powers, epsilon)
    return OpenDPRelease(measurement, prepare, lambda s: np.asarray(s).reshape(k, 1 + powers))


def group_means(
    values: np.ndarray, groups: np.ndarray, k: int, bounds: tuple[float, float], epsilon: float
) -> OpenDPRelease:
    """Mean per group from :func:`group_moments`, divided as dpnode divides (an empty-looking
    group gets the middle of the bounds)."""
    release = group_moments(values, groups, k, bounds, 1, epsilon)

    def means(released: Any) -> np.ndarray:
        s = release.post(released)
        count, total = s[:, 0], s[:, 1]
        u = np.where(count >= 1, total / np.maximum(count, 1), 0.0)
        return uncentre(np.clip(u, -1, 1), bounds)

    return OpenDPRelease(release.measurement, release.prepare, means)


def group_variances(
    values: np.ndarray, groups: np.ndarray, k: int, bounds: tuple[float, float], epsilon: float
) -> OpenDPRelease:
    """Sample variance per group from :func:`group_moments` (powers 1 and 2), clipped into
    [0, the largest a group of values in the bounds can have]."""
    release = group_moments(values, groups, k, bounds, 2, epsilon)
    half = (float(bounds[1]) - float(bounds[0])) / 2

    def variances(released: Any) -> np.ndarray:
        s = release.post(released)
        count, s1, s2 = np.maximum(s[:, 0], 2.0), s[:, 1], s[:, 2]
        var_u = (s2 - s1**2 / count) / (count - 1)
        return half**2 * np.clip(var_u, 0.0, 1.0)

    return OpenDPRelease(release.measurement, release.prepare, variances)


def products(
    columns: list[np.ndarray], bounds: list[tuple[float, float]], epsilon: float
) -> tuple[OpenDPRelease, np.ndarray]:
    """The sums of the centred columns and of their pairwise products (upper triangle):
    each row's vector has L1 norm at most ``k + k (k + 1) / 2``. Returns the release of
    ``(sums (k,), products (k, k))`` in the centred units, and the columns' half widths."""
    k, n = len(columns), len(columns[0])
    upper = np.triu_indices(k)

    def prepare() -> np.ndarray:
        u = np.stack([centred(c, b) for c, b in zip(columns, bounds, strict=True)], axis=1)
        return np.c_[u, (u[:, :, None] * u[:, None, :])[:, upper[0], upper[1]]]

    width = k + len(upper[0])
    measurement, _ = moment_sums(width, n, float(width), epsilon)

    def unpack(released: Any) -> tuple[np.ndarray, np.ndarray]:
        s = np.asarray(released, dtype=float)
        gram = np.zeros((k, k))
        gram[upper] = s[k:]
        gram = gram + np.triu(gram, 1).T
        return s[:k], gram

    halves = np.array([(float(b[1]) - float(b[0])) / 2 for b in bounds])
    return OpenDPRelease(measurement, prepare, unpack), halves


def covariance(
    columns: list[np.ndarray], bounds: list[tuple[float, float]], epsilon: float
) -> OpenDPRelease:
    """The sample covariance matrix (as ``torch.cov``) from :func:`products`; its diagonal
    clipped at 0 (a variance)."""
    release, halves = products(columns, bounds, epsilon)
    n = len(columns[0])

    def cov(released: Any) -> np.ndarray:
        sums, gram = release.post(released)
        c = (gram - np.outer(sums, sums) / n) / (n - 1)
        np.fill_diagonal(c, np.maximum(np.diag(c), 0.0))
        return c * np.outer(halves, halves)

    return OpenDPRelease(release.measurement, release.prepare, cov)


def correlation(
    columns: list[np.ndarray], bounds: list[tuple[float, float]], epsilon: float
) -> OpenDPRelease:
    """The correlation matrix (as ``torch.corrcoef``) from the noised covariance, clipped into
    [-1, 1]; a variance released at 0 or below gives correlations of 0."""
    cov = covariance(columns, bounds, epsilon)

    def corr(released: Any) -> np.ndarray:
        c = cov.post(released)
        sd = np.sqrt(np.diag(c))
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(np.outer(sd, sd) > 0, c / np.outer(sd, sd), 0.0)
        np.fill_diagonal(r, 1.0)
        return np.clip(r, -1.0, 1.0)

    return OpenDPRelease(cov.measurement, cov.prepare, corr)


#: describe's statistics after the (public) count, in pandas' order
DESCRIBE = ("mean", "std", "min", "25%", "50%", "75%", "max")
_DESCRIBE_QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)


def describe(
    columns: list[np.ndarray],
    bounds: list[tuple[float, float]],
    integral: list[bool],
    epsilon: float,
) -> OpenDPRelease:
    """pandas' ``describe`` without its count (public): for each column its mean, standard
    deviation and five quantiles, seven measurements a column, each at an equal share of
    ``epsilon``. The output is ``(7, columns)``."""
    dp = _dp()
    share = epsilon / (len(DESCRIBE) * len(columns))
    parts: list[Any] = []
    grids: list[np.ndarray] = []
    for values, b, whole in zip(columns, bounds, integral, strict=True):
        space = sized_floats(len(values), b)
        parts += [
            laplace(space >> dp.t.then_mean(), share),
            laplace(space >> dp.t.then_variance(), share),
        ]
        for alpha in _DESCRIBE_QUANTILES:
            pick, grid = quantile_pick(len(values), b, whole, alpha, share)
            parts.append(pick)
        grids.append(grid)

    def prepare() -> list[list[float]]:
        return [c.astype(np.float64).tolist() for c in columns for _ in DESCRIBE]

    def table(released: list[Any]) -> np.ndarray:
        out = np.zeros((len(DESCRIBE), len(columns)))
        for j, grid in enumerate(grids):
            mean, var, *picks = released[j * len(DESCRIBE) : (j + 1) * len(DESCRIBE)]
            out[:, j] = [mean, math.sqrt(max(var, 0.0)), *(grid[i] for i in picks)]
        return out

    return OpenDPRelease(Sequential(parts), prepare, table)


def regression(x: np.ndarray, y: np.ndarray, epsilon: float) -> OpenDPRelease:
    """Least squares of ``y`` on the two columns of ``x`` (all in [0, 1]) from OpenDP's noised
    sufficient statistics: centred on 1/2 (in [-1/2, 1/2]: a third of the L1 norm
    uncentred), each row is ``(u1^2, u1 u2, u2^2, u1, u2, u1 v, u2 v, v)`` of L1 norm at most
    2.75, summed and noised once; the normal equations are solved with dpnode's ridge (the
    smallest that makes the noised Gram matrix positive definite, plus the noise's scale) and
    the coefficients moved back from the centred coordinates. Returns ``(b1, b2, intercept)``.
    """

    def prepare() -> np.ndarray:
        u, v = x - 0.5, y - 0.5
        return np.c_[u[:, 0] ** 2, u[:, 0] * u[:, 1], u[:, 1] ** 2, u, u * v[:, None], v]

    n = len(y)
    measurement, scale = moment_sums(8, n, 3 * 0.25 + 2 * 0.5 + 2 * 0.25 + 0.5, epsilon)

    def solve(released: Any) -> np.ndarray:
        s11, s12, s22, s1, s2, s1v, s2v, sv = np.asarray(released)
        gram = np.array([[s11, s12, s1], [s12, s22, s2], [s1, s2, float(n)]])
        ridge = max(0.0, -float(np.linalg.eigvalsh(gram).min())) + scale
        b1, b2, c = np.linalg.solve(gram + ridge * np.eye(3), [s1v, s2v, sv])
        return np.array([b1, b2, c + 0.5 - 0.5 * (b1 + b2)])

    return OpenDPRelease(measurement, prepare, solve)


def keys_above_threshold(values: np.ndarray, epsilon: float, delta: float) -> OpenDPRelease:
    """OpenDP's ``make_count_by`` and Laplace threshold: the keys present whose noisy count
    clears the threshold, as ``(key, noisy count)`` rows sorted by key. Noise of scale
    ``2 / epsilon`` (a replaced row moves two counts by one); the threshold is the smallest
    integer whose privacy map at a replaced row (symmetric distance 2, which ``count_by``
    takes to at most 2 keys changed by at most 2 each) is within ``delta``."""
    dp = _dp()
    space = dp.vector_domain(dp.atom_domain(T=dp.i64), size=len(values)), dp.symmetric_distance()
    counted = dp.t.make_count_by(*space)
    scale = 2.0 / epsilon

    def made(tau: int) -> Any:
        return counted >> dp.m.then_laplace_threshold(scale=scale, threshold=tau)

    tau = 2
    while made(tau).map(REPLACE_ONE)[1] > delta:
        tau += 1

    def rows(released: Any) -> np.ndarray:
        pairs = sorted((float(k), float(c)) for k, c in released.items())
        return np.array(pairs, dtype=np.float64).reshape(-1, 2)

    return OpenDPRelease(made(tau), ints(values), rows)
