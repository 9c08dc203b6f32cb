"""The analyst's statistics against OpenDP: mean absolute error at the same epsilon.

    python -m bench.utility_stats [--repeat 1000] [--epsilon 1.0]

The diabetes data (scikit-learn, unscaled: 442 patients, age 19-79, BMI 18-42) is uploaded to
an in-process node with public bounds (age [0, 120], BMI [10, 70]); each statistic is
released ``repeat`` times at ``epsilon`` by dpnode, with the torch code an analyst writes, and
by OpenDP with its own constructors, and the mean absolute error against the true value is
printed for both, with their ratio (below 1: dpnode is more accurate). A side that has no
release of a row prints "-".

Both sides use the same neighbours: the row count is public and a neighbouring dataset
replaces one patient's row (dpnode's privacy unit; for OpenDP a sized vector domain and a
symmetric distance of 2, and each measurement's ``map(2)`` is the row's epsilon, its noise
scale found by ``binary_search``). A vector's error is the mean over its elements.

* Count, sum, mean, variance, histogram: Laplace, pure DP, on both sides.
* Median and 25% / 75% quantiles of age and BMI, each at the full epsilon: OpenDP scores
  the candidates (``then_quantile_score_candidates``) and picks one with its noisy max
  (``then_noisy_max``: exponential noise under pure DP, the replacement of the deprecated
  Gumbel report-noisy-max). The candidates are dpnode's: 4097 equally spaced points over
  the column's public bounds (both columns are floats; steps of 0.03 years and 0.015 BMI
  units), so both sides choose from the same grid. Ages are whole years, so every candidate
  between two neighbouring ages scores alike: about half a year of error remains at any
  epsilon.
* Per-group means (``ds.groupby(key).mean("bmi", epsilon=)``: Laplace, each row one vector
  of its centred value and count, clipped in L1 by the node) and linear regression
  coefficients (``sdk.linear_regression``, of the disease progression on age and BMI, all
  scaled into [0, 1] by their bounds; the error against least squares on the data; Gaussian
  at delta 1e-6 in dpnode). OpenDP's framework API has no partition combinator outside its
  polars front end (not installed here), and its DP ``LinearRegression`` (Theil-Sen, in
  ``opendp.extras.sklearn``) takes a single feature, so both are built from its numpy
  constructors the way dpnode builds them: each row becomes one vector (its per-group
  centred value and count, or its centred sufficient statistics ``x x^T``, ``x``, ``x y``,
  ``y``), whose norm is bounded (``then_np_clamp``) and which are summed (``make_np_sum``,
  under OpenDP's "idealized-numerics" flag) and noised once: a replaced row moves out of
  one group and into another inside that one vector. OpenDP's side uses Laplace noise on the
  L1 norm, pure epsilon-DP and so also (epsilon, 1e-6)-DP: at this delta it is less noise
  than its Gaussian on the L2 norm (for the group means at epsilon 1, scale 4 against a
  standard deviation of 12.8), and so is dpnode's for the group means. Means and the normal
  equations are solved as dpnode does (post-processing).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.utility import PASSWORD, in_process_node
from dpnode import sdk

AGE, BMI = (0.0, 120.0), (10.0, 70.0)
BINS = 10
#: the quantile rows: (label, alpha) for each of (column, its name in a row, public bounds)
QUANTILES = (("median", 0.5), ("25% quantile", 0.25), ("75% quantile", 0.75))
QUANTILE_COLUMNS = (("age", "age", AGE), ("bmi", "BMI", BMI))
#: the quantile candidates: this many equally spaced points over a column's public bounds
GRID = 4097


def quantile_rows() -> list[tuple[str, str, tuple[float, float], float]]:
    """Each quantile row's name, column, bounds and alpha, in the table's order.

    >>> quantile_rows()[0]
    ('median (age)', 'age', (0.0, 120.0), 0.5)
    """
    return [
        (f"{label} ({name})", column, bounds, alpha)
        for column, name, bounds in QUANTILE_COLUMNS
        for label, alpha in QUANTILES
    ]


def load() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_diabetes

    d = load_diabetes(scaled=False)
    age = d.data[:, 0].astype(np.float64)
    return {
        "age": age,
        "bmi": d.data[:, 2].astype(np.float64),
        "sex": d.data[:, 1].astype(np.int64) - 1,  # 1 and 2 in the data: groups 0 and 1
        "age_group": np.clip((age - 19) // 6, 0, 9).astype(np.int64),  # 10 groups
        "target": d.target.astype(np.float64),
    }


def truths(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    age, bmi = data["age"], data["bmi"]
    return {
        "count (age > 50)": np.array(float(np.sum(age > 50))),
        "sum (BMI)": np.array(bmi.sum()),
        "mean (BMI)": np.array(bmi.mean()),
        "variance (BMI)": np.array(bmi.var(ddof=1)),
        f"histogram (age, {BINS} bins)": np.histogram(age, bins=BINS, range=AGE)[0].astype(float),
        **{
            name: np.array(np.quantile(data[column], alpha))
            for name, column, _, alpha in quantile_rows()
        },
        **{
            f"mean BMI per {key} ({k} groups)": np.array(
                [bmi[data[key] == g].mean() for g in range(k)]
            )
            for key, k in GROUPS
        },
        REGRESSION: _least_squares(data),
    }


#: linear regression of the disease progression (target / 400) on age / 120 and BMI / 70
REGRESSION = "regression coefficients (2 + intercept, Gaussian)"
TARGET = (0.0, 400.0)


def _features(data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    x = np.c_[data["age"] / AGE[1], data["bmi"] / BMI[1]]
    return x, data["target"] / TARGET[1]


def _least_squares(data: dict[str, np.ndarray]) -> np.ndarray:
    x, y = _features(data)
    return np.linalg.lstsq(np.c_[x, np.ones(len(y))], y, rcond=None)[0]


#: group-by rows: the key column and its number of groups
GROUPS = (("sex", 2), ("age_group", 10))
#: the regression's delta (dpnode's linear regression is Gaussian)
GROUP_DELTA = 1e-6


def dpnode_queries(ds: object) -> dict[str, Callable[[], torch.Tensor]]:
    age, bmi = ds["age"], ds["bmi"]  # type: ignore[index]
    return {
        "count (age > 50)": lambda: (age > 50).sum(),
        "sum (BMI)": lambda: bmi.sum(),
        "mean (BMI)": lambda: bmi.mean(),
        "variance (BMI)": lambda: bmi.var(),
        f"histogram (age, {BINS} bins)": lambda: torch.histc(
            age, bins=BINS, min=AGE[0], max=AGE[1]
        ),
        # the exponential mechanism over the column's public range (dpnode.core.dp.selection)
        **{
            name: (lambda column=column, alpha=alpha: torch.quantile(ds[column], alpha))  # type: ignore[index]
            for name, column, _, alpha in quantile_rows()
        },
    }


def dpnode_group_means(ds: object, epsilon: float) -> dict[str, Callable[[], np.ndarray]]:
    def mean_by(key: str) -> Callable[[], np.ndarray]:
        def release() -> np.ndarray:
            grouped = ds.groupby(key)  # type: ignore[attr-defined]
            means = grouped.mean("bmi", epsilon=epsilon)
            return np.array(list(means.values()))

        return release

    def regression() -> np.ndarray:
        age, bmi, target = ds["age"], ds["bmi"], ds["target"]  # type: ignore[index]
        x = torch.stack([age / AGE[1], bmi / BMI[1]], dim=1)
        model = sdk.linear_regression(x, target / TARGET[1], epsilon=epsilon, delta=GROUP_DELTA)
        return np.r_[model.coef.numpy(), model.intercept]

    releases = {f"mean BMI per {key} ({k} groups)": mean_by(key) for key, k in GROUPS}
    return {**releases, REGRESSION: regression}


@dataclass(frozen=True)
class OpenDPRelease:
    """An OpenDP measurement, the data it is applied to and the post-processing of its output
    into the row's value; calling it releases once."""

    measurement: Any
    data: Any
    post: Callable[[Any], np.ndarray] = np.asarray

    def __call__(self) -> np.ndarray:
        return self.post(self.measurement(self.data))


#: a replaced row, OpenDP's ``d_in`` on a sized domain: one removal and one addition
REPLACE_ONE = 2


def opendp_releases(data: dict[str, np.ndarray], epsilon: float) -> dict[str, OpenDPRelease]:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    n = len(data["age"])
    age, bmi = list(map(float, data["age"])), list(map(float, data["bmi"]))

    def sized(bounds: tuple[float, float]) -> tuple[object, object]:
        return dp.vector_domain(dp.atom_domain(bounds=bounds), size=n), dp.symmetric_distance()

    def laplace(chain: object) -> object:
        return dp.binary_search_chain(
            lambda s: chain >> dp.m.then_laplace(scale=s), d_in=REPLACE_ONE, d_out=epsilon
        )

    above = [1.0 if a > 50 else 0.0 for a in age]
    count = laplace(sized((0.0, 1.0)) >> dp.t.then_sum())
    total = laplace(sized(BMI) >> dp.t.then_sum())
    mean = laplace(sized(BMI) >> dp.t.then_mean())
    variance = laplace(sized(BMI) >> dp.t.then_variance())
    width = (AGE[1] - AGE[0]) / BINS
    bins = [min(int((a - AGE[0]) // width), BINS - 1) for a in age]
    hist_space = dp.vector_domain(dp.atom_domain(T=int), size=n), dp.symmetric_distance()
    hist = laplace(
        hist_space
        >> dp.t.then_count_by_categories(categories=list(range(BINS)), null_category=False)
    )
    return {
        "count (age > 50)": OpenDPRelease(count, above),
        "sum (BMI)": OpenDPRelease(total, bmi),
        "mean (BMI)": OpenDPRelease(mean, bmi),
        "variance (BMI)": OpenDPRelease(variance, bmi),
        f"histogram (age, {BINS} bins)": OpenDPRelease(hist, bins),
        **opendp_quantiles(data, epsilon),
        **opendp_group_means(data, epsilon),
        REGRESSION: opendp_regression(data, epsilon),
    }


def opendp_quantiles(data: dict[str, np.ndarray], epsilon: float) -> dict[str, OpenDPRelease]:
    """Each quantile row at the full epsilon: OpenDP's candidate scores and noisy max over
    dpnode's grid of candidates (see the module docstring)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    n = len(data["age"])
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n), dp.symmetric_distance()
    out = {}
    for name, column, bounds, alpha in quantile_rows():
        candidates = [float(c) for c in np.linspace(*bounds, GRID)]
        scores = space >> dp.t.then_quantile_score_candidates(candidates, alpha)
        pick = dp.binary_search_chain(
            lambda s, scores=scores: (
                scores >> dp.m.then_noisy_max(dp.max_divergence(), scale=s, negate=True)
            ),
            d_in=REPLACE_ONE,
            d_out=epsilon,
        )
        out[name] = OpenDPRelease(
            pick, list(map(float, data[column])), lambda i, c=candidates: np.array(c[i])
        )
    return out


def _np_laplace_sum(rows: np.ndarray, norm: float, epsilon: float) -> tuple[object, float]:
    """OpenDP's Laplace on the column sums of ``rows``, each row of L1 norm at most ``norm``
    (a sized domain, so a replaced row changes the sums by ``2 * norm``): the measurement
    and its noise scale."""
    import opendp.prelude as dp
    from opendp.extras.numpy._make_np_sum import then_np_sum

    # the sums of floats are taken as exact, as OpenDP's numpy constructors require
    dp.enable_features("contrib", "idealized-numerics")
    space = dp.numpy.array2_domain(size=len(rows), num_columns=rows.shape[1], T=float)
    summed = (space, dp.symmetric_distance()) >> dp.numpy.then_np_clamp(norm, p=1) >> then_np_sum()
    scale = dp.binary_search_param(
        lambda s: summed >> dp.m.then_laplace(s), d_in=REPLACE_ONE, d_out=epsilon
    )
    return summed >> dp.m.then_laplace(scale), scale


def opendp_group_means(data: dict[str, np.ndarray], epsilon: float) -> dict[str, OpenDPRelease]:
    """Mean BMI per group: each row is one vector of its group's centred BMI (in [-1, 1], as
    dpnode's) and its group's count, zero elsewhere (L1 norm at most 2); the sums are noised
    together and divided as dpnode divides them."""
    lo, hi = BMI
    middle, half = (lo + hi) / 2, (hi - lo) / 2
    out = {}
    for key, k in GROUPS:
        n, group = len(data[key]), data[key]
        rows = np.zeros((n, 2 * k))
        rows[np.arange(n), group] = (data["bmi"] - middle) / half
        rows[np.arange(n), k + group] = 1.0
        measurement, _ = _np_laplace_sum(rows, 2.0, epsilon)

        def means(released: Any, k: int = k) -> np.ndarray:
            sums, counts = np.asarray(released[:k]), np.asarray(released[k:])
            mean = middle + half * sums / np.maximum(counts, 1)
            return np.clip(np.where(counts >= 1, mean, middle), lo, hi)

        out[f"mean BMI per {key} ({k} groups)"] = OpenDPRelease(measurement, rows, means)
    return out


def opendp_regression(data: dict[str, np.ndarray], epsilon: float) -> OpenDPRelease:
    """The regression from OpenDP's noised sufficient statistics: features and target in
    [0, 1] are centred on 1/2 (in [-1/2, 1/2]: a third of the L1 norm uncentred), each row
    is ``(u1^2, u1 u2, u2^2, u1, u2, u1 v, u2 v, v)`` of L1 norm at most 2.75, summed and
    noised once; the normal equations are solved with dpnode's ridge (the smallest that makes
    the noised Gram matrix positive definite, plus the noise's scale) and the coefficients
    moved back from the centred coordinates."""
    x, y = _features(data)
    u, v = x - 0.5, y - 0.5
    rows = np.c_[u[:, 0] ** 2, u[:, 0] * u[:, 1], u[:, 1] ** 2, u, u * v[:, None], v]
    measurement, scale = _np_laplace_sum(rows, 3 * 0.25 + 2 * 0.5 + 2 * 0.25 + 0.5, epsilon)
    n = float(len(y))

    def solve(released: Any) -> np.ndarray:
        s11, s12, s22, s1, s2, s1v, s2v, sv = np.asarray(released)
        gram = np.array([[s11, s12, s1], [s12, s22, s2], [s1, s2, n]])
        ridge = max(0.0, -float(np.linalg.eigvalsh(gram).min())) + scale
        b1, b2, c = np.linalg.solve(gram + ridge * np.eye(3), [s1v, s2v, sv])
        return np.array([b1, b2, c + 0.5 - 0.5 * (b1 + b2)])

    return OpenDPRelease(measurement, rows, solve)


def _errors(values: list[np.ndarray], truth: np.ndarray) -> np.ndarray:
    """Each release's absolute error (a vector's: the mean over its elements)."""
    return np.array([np.mean(np.abs(np.asarray(v, dtype=float) - truth)) for v in values])


def _row(name: str, ours: np.ndarray | None, theirs: np.ndarray | None) -> str:
    """One line of the table: each side's mean absolute error, and their ratio with its
    standard error (the delta method over the releases); a side with no release prints "-".

    >>> _row("median (age)", None, np.array([0.51234]))
    '| median (age) | - | 0.5123 | - |'
    >>> _row("sum", np.array([1.0, 3.0]), np.array([2.0, 2.0]))
    '| sum | 2 | 2 | 1.00 ± 0.50 |'
    """
    means = [float(e.mean()) if e is not None else None for e in (ours, theirs)]
    cells = [f"{m:.4g}" if m is not None else "-" for m in means]
    ratio = "-"
    if ours is not None and theirs is not None and means[1]:
        a, b = means
        assert a is not None and b is not None
        relative = (
            [
                e.std(ddof=1) / (m * math.sqrt(e.size)) if m else 0.0
                for e, m in ((ours, a), (theirs, b))
            ]
            if min(ours.size, theirs.size) > 1
            else [0.0, 0.0]
        )
        ratio = f"{a / b:.2f} ± {a / b * math.hypot(*relative):.2f}"
    return f"| {name} | {cells[0]} | {cells[1]} | {ratio} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    data = load()
    truth = truths(data)
    ours: dict[str, list[np.ndarray]] = {}
    theirs = {
        k: [f() for _ in range(args.repeat)] for k, f in opendp_releases(data, args.epsilon).items()
    }
    with tempfile.TemporaryDirectory() as tmp, in_process_node(Path(tmp)) as login:
        admin, owner = login("admin@x.org"), login("owner@x.org")
        owner.upload_dataset(
            "diabetes",
            data,
            bounds={"age": AGE, "bmi": BMI, "sex": (0, 1), "age_group": (0, 9), "target": TARGET},
        )
        budget = 2 * args.epsilon * args.repeat * len(truth)
        admin.set_policy(
            f"[roles.data_scientist]\nepsilon = {budget!r}\ndelta = 0.5\n", reason="bench"
        )
        admin.create_user("analyst@x.org", PASSWORD)
        ds = login("analyst@x.org").dataset("diabetes")
        for name, query in dpnode_queries(ds).items():
            ours[name] = [query().publish(epsilon=args.epsilon).numpy() for _ in range(args.repeat)]
        for name, release in dpnode_group_means(ds, args.epsilon).items():
            ours[name] = [release() for _ in range(args.repeat)]
    print(
        f"diabetes, n = {len(data['age'])}, epsilon {args.epsilon:g} (dpnode's regression: "
        f"delta {GROUP_DELTA:g}), {args.repeat} releases each; mean absolute error\n"
    )
    print("| statistic | dpnode | OpenDP | dpnode / OpenDP (± standard error) |")
    print("|---|---|---|---|")
    for name, t in truth.items():
        a = _errors(ours[name], t) if name in ours else None
        b = _errors(theirs[name], t) if name in theirs else None
        print(_row(name, a, b))


if __name__ == "__main__":
    main()
