"""Covariance, correlation and least squares against OpenDP: mean absolute error, same epsilon.

    python -m bench.moments [--repeat 200] [--epsilon 1.0] [--same-vector]

Two tables are uploaded to an in-process node with public bounds: a census-like table (20,000
synthetic rows: integer ``age`` in [17, 90] and ``hours`` in [1, 99], float ``income`` in
[0, 250000], correlated as in census extracts) and the wine data (scikit-learn: 178 rows,
float columns, bounds rounded outward from the columns' ranges). Each statistic is released
``repeat`` times by dpnode with the code an analyst writes (``torch.cov(x).publish(...)``,
``torch.corrcoef(x).publish(...)``, ``sdk.linear_regression(...)``) and by OpenDP from its
numpy constructors, and the mean absolute error against the exact value is printed for both,
with their ratio (below 1: dpnode is more accurate). A matrix's error is the mean over its
elements (a correlation's: over those off the diagonal, which are 1 on both sides); a
regression's over its coefficients and intercept.

Both sides use the same neighbours: the row count is public and a neighbouring table
replaces one row (OpenDP: a sized domain and a symmetric distance of 2, the noise scale
found by ``binary_search_param``). OpenDP has no covariance or multi-feature regression
measurement, so its side is built as dpnode's was before (and as ``bench/utility_stats``
builds its regression): each row becomes one vector of its columns centred on the middle of
their bounds and scaled by half their width, ``[u_i, u_i u_j (i <= j)]`` (for least squares
the target's square left out), bounded in L1 norm (``then_np_clamp``) by the sum of its
elements' largest sizes, summed (``make_np_sum``, under OpenDP's "idealized-numerics" flag)
and noised once with Laplace noise, pure epsilon-DP (so also (epsilon, delta)-DP: at delta
1e-6 and these few columns it is less noise than OpenDP's Gaussian on the L2 norm).
dpnode's vector differs in what ``dpnode/sdk/_moments.py`` explains: the squares enter as
``u^2 - 1``, the parts are weighted, and the norm is the one with the smaller error. Both
sides then compute the matrices and solve the normal equations with the same code
(``dpnode.sdk._moments.Moments``, ``dpnode.sdk._regression.fit_from_moments``): the
difference is the release alone. ``--same-vector`` gives OpenDP dpnode's vector and norm
bound too (the ratios are then 1 within their spread: the samplers agree).

The last row is the correlation matrix of all 13 wine columns at delta 1e-6, where dpnode
chooses the L2 norm and Gaussian noise; OpenDP's side is its Laplace on the L1 norm.
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
from bench.utility_stats import REPLACE_ONE, error_line
from dpnode import sdk
from dpnode.sdk._moments import MomentPlan, Moments, decode, weighted_plan
from dpnode.sdk._regression import fit_from_moments

CENSUS_ROWS = 20_000
CENSUS_BOUNDS = {"age": (17.0, 90.0), "hours": (1.0, 99.0), "income": (0.0, 250_000.0)}
WINE_BOUNDS = {
    "alcohol": (11.0, 15.0),
    "malic_acid": (0.5, 6.0),
    "ash": (1.0, 3.5),
    "alcalinity_of_ash": (10.0, 30.0),
    "magnesium": (70.0, 170.0),
    "total_phenols": (0.5, 4.0),
    "flavanoids": (0.0, 5.5),
    "nonflavanoid_phenols": (0.1, 0.7),
    "proanthocyanins": (0.4, 3.6),
    "color_intensity": (1.0, 13.0),
    "hue": (0.4, 1.8),
    "od280": (1.0, 4.0),
    "proline": (250.0, 1700.0),
}


def census(seed: int = 0) -> dict[str, np.ndarray]:
    """Census-like rows: ages and weekly hours as whole numbers, income rising with both."""
    rng = np.random.default_rng(seed)
    age = np.clip(np.round(rng.gamma(6.0, 6.5, CENSUS_ROWS) + 17), 17, 90)
    hours = np.clip(np.round(rng.normal(40 + 0.05 * (age - 38), 12)), 1, 99)
    log_income = 9.4 + 0.022 * (age - 17) - 0.00025 * (age - 17) ** 2 + 0.012 * hours
    income = np.clip(np.exp(log_income + rng.normal(0, 0.6, CENSUS_ROWS)), 0, 250_000)
    return {"age": age.astype(np.int64), "hours": hours.astype(np.int64), "income": income}


def wine() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_wine

    d = load_wine()
    return {name: d.data[:, j].astype(np.float64) for j, name in enumerate(WINE_BOUNDS)}


@dataclass(frozen=True)
class Row:
    """One statistic: its table, columns (for a regression the last is the target), kind
    (``cov``, ``corrcoef`` or ``regression``) and the publish's delta."""

    name: str
    table: str
    columns: tuple[str, ...]
    kind: str
    delta: float | None = None

    @property
    def target(self) -> bool:
        return self.kind == "regression"


ROWS = (
    Row("cov(age, hours)", "census", ("age", "hours"), "cov"),
    Row("cov(age, income)", "census", ("age", "income"), "cov"),
    Row("corrcoef(age, hours)", "census", ("age", "hours"), "corrcoef"),
    Row("corrcoef(age, income)", "census", ("age", "income"), "corrcoef"),
    Row("income ~ age + hours", "census", ("age", "hours", "income"), "regression", 1e-6),
    Row("cov(alcohol, color_intensity)", "wine", ("alcohol", "color_intensity"), "cov"),
    Row("corrcoef(total_phenols, flavanoids)", "wine", ("total_phenols", "flavanoids"), "corrcoef"),
    Row(
        "flavanoids ~ total_phenols + od280",
        "wine",
        ("total_phenols", "od280", "flavanoids"),
        "regression",
        1e-6,
    ),
    Row("corrcoef(13 columns), delta 1e-6", "wine", tuple(WINE_BOUNDS), "corrcoef", 1e-6),
)


def truth(row: Row, data: dict[str, np.ndarray]) -> np.ndarray:
    x = np.stack([data[c].astype(np.float64) for c in row.columns])
    if row.kind == "cov":
        return np.cov(x)
    if row.kind == "corrcoef":
        return _off_diagonal(np.corrcoef(x))
    z = np.c_[x[:-1].T, np.ones(x.shape[1])]
    return np.linalg.lstsq(z, x[-1], rcond=None)[0]


def _off_diagonal(m: np.ndarray) -> np.ndarray:
    return m[~np.eye(len(m), dtype=bool)]


def _statistic(row: Row, m: Moments, scale: float, sd: float) -> np.ndarray:
    """The row's statistic from released moments (the same code for both sides): ``scale``
    and ``sd`` are the noise's scale and standard deviation on each coordinate."""
    if row.kind == "cov":
        return m.cov().numpy()
    if row.kind == "corrcoef":
        return _off_diagonal(m.corrcoef(noise=sd).numpy())
    coef, intercept, _ = fit_from_moments(
        m, fit_intercept=True, ridge=None, noise=scale / m.plan.cross
    )
    return np.r_[coef.numpy(), intercept]


def dpnode_release(row: Row, ds: Any, epsilon: float) -> Callable[[], np.ndarray]:
    columns = [ds[c].to(torch.float64) for c in row.columns]

    def release() -> np.ndarray:
        if row.kind == "regression":
            x = torch.stack(columns[:-1], dim=1)
            fit = sdk.linear_regression(x, columns[-1], epsilon=epsilon, delta=row.delta)
            return np.r_[fit.coef.numpy(), fit.intercept]
        x = torch.stack(columns)
        call = torch.cov if row.kind == "cov" else torch.corrcoef
        out = call(x).publish(epsilon=epsilon, delta=row.delta).numpy()
        return out if row.kind == "cov" else _off_diagonal(out)

    return release


def _plain_plan(row: Row) -> MomentPlan:
    """OpenDP's vector: dpnode's layout with weights 1 (the squares' offset is undone in
    :func:`_plain_rows`)."""
    return MomentPlan(len(row.columns) - int(row.target), row.target, 1)


def _plain_rows(u: np.ndarray, plan: MomentPlan, offset: float) -> np.ndarray:
    k = plan.features
    pairs = plan.pairs()
    parts = [u * plan.first, (u[:, :k] ** 2 - offset) * plan.square]
    if pairs:
        left, right = [i for i, _ in pairs], [j for _, j in pairs]
        parts.append(u[:, left] * u[:, right] * plan.cross)
    return np.concatenate(parts, axis=1)


def opendp_release(
    row: Row,
    data: dict[str, np.ndarray],
    bounds: dict[str, tuple[float, float]],
    epsilon: float,
    same_vector: bool,
) -> tuple[Any, Callable[[], np.ndarray]]:
    """OpenDP's measurement for ``row`` and a function releasing the row's statistic once."""
    lo = np.array([bounds[c][0] for c in row.columns])
    hi = np.array([bounds[c][1] for c in row.columns])
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    x = np.stack([data[c].astype(np.float64) for c in row.columns], axis=1)
    u = (x - mid) / half
    if same_vector:
        plan = weighted_plan(len(row.columns) - int(row.target), row.target, 1)
        offset, norm = 1.0, plan.bound
    else:
        plan, offset = _plain_plan(row), 0.0
        norm = float(plan.columns + plan.features + len(plan.pairs()))
    rows = _plain_rows(u, plan, offset)
    measurement, scale, sd = _opendp_sum(rows, norm, epsilon, row.delta)
    n = len(rows)
    mid_t, half_t = torch.from_numpy(mid), torch.from_numpy(half)

    def release() -> np.ndarray:
        out = measurement(rows)
        v = torch.from_numpy(
            np.asarray(out[0] if isinstance(out, tuple) else out, dtype=np.float64)
        )
        # the squares were sent as they are: decode's offset of the row count taken back
        k, cols = plan.features, plan.columns
        v[cols : cols + k] -= (1.0 - offset) * n * plan.square
        m = decode(plan, n, mid_t, half_t, v, None)
        return _statistic(row, m, scale, sd)

    return measurement, release


def _opendp_sum(
    rows: np.ndarray, norm_l1: float, epsilon: float, delta: float | None
) -> tuple[Any, float, float]:
    """OpenDP's noised column sums of ``rows`` (each of L1 norm at most ``norm_l1``, and of L2
    norm at most ``sqrt(norm_l1)``: every element is at most 1 in size): Laplace on the L1
    norm, or with ``delta`` the Gaussian on the L2 norm where its noise is smaller. Returns
    the measurement, its noise scale and the noise's standard deviation."""
    import opendp.prelude as dp
    from opendp.extras.numpy._make_np_sum import then_np_sum

    dp.enable_features("contrib", "idealized-numerics")
    space = dp.numpy.array2_domain(size=len(rows), num_columns=rows.shape[1], T=float)

    def summed(p: int, norm: float) -> Any:
        return (
            (space, dp.symmetric_distance()) >> dp.numpy.then_np_clamp(norm, p=p) >> then_np_sum()
        )

    l1 = summed(1, norm_l1)
    b = dp.binary_search_param(
        lambda s: l1 >> dp.m.then_laplace(s), d_in=REPLACE_ONE, d_out=epsilon
    )
    if delta is None:
        return l1 >> dp.m.then_laplace(b), b, math.sqrt(2) * b
    l2 = summed(2, math.sqrt(norm_l1))

    def gaussian(s: float) -> Any:
        return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(l2 >> dp.m.then_gaussian(s)), delta)

    sigma = dp.binary_search_param(gaussian, d_in=REPLACE_ONE, d_out=(epsilon, delta))
    if sigma < math.sqrt(2) * b:
        return gaussian(sigma), sigma, sigma
    return l1 >> dp.m.then_laplace(b), b, math.sqrt(2) * b


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--same-vector", action="store_true")
    args = parser.parse_args()
    tables = {"census": (census(), CENSUS_BOUNDS), "wine": (wine(), WINE_BOUNDS)}
    theirs = {
        r.name: [
            f()
            for _, f in [opendp_release(r, *tables[r.table], args.epsilon, args.same_vector)]
            for _ in range(args.repeat)
        ]
        for r in ROWS
    }
    ours: dict[str, list[np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as tmp, in_process_node(Path(tmp)) as login:
        admin, owner = login("admin@x.org"), login("owner@x.org")
        for name, (data, bounds) in tables.items():
            owner.upload_dataset(name, data, bounds=bounds)
        budget = 2 * args.epsilon * args.repeat * len(ROWS)
        admin.set_policy(
            f"[roles.data_scientist]\nepsilon = {budget!r}\ndelta = 0.5\n", reason="bench"
        )
        admin.create_user("analyst@x.org", PASSWORD)
        analyst = login("analyst@x.org")
        for r in ROWS:
            release = dpnode_release(r, analyst.dataset(r.table), args.epsilon)
            ours[r.name] = [release() for _ in range(args.repeat)]
    vector = "dpnode's vector" if args.same_vector else "the plain moment vector"
    print(
        f"epsilon {args.epsilon:g}, {args.repeat} releases each, OpenDP with {vector}; "
        "mean absolute error\n"
    )
    print("| statistic | dpnode | OpenDP | dpnode / OpenDP (± standard error) |")
    print("|---|---|---|---|")
    for r in ROWS:
        t = truth(r, tables[r.table][0])
        errors = [
            np.array([np.mean(np.abs(v - t)) for v in side])
            for side in (ours[r.name], theirs[r.name])
        ]
        print(error_line(f"{r.name} ({r.table})", *errors))


if __name__ == "__main__":
    main()
