"""The analyst's statistics against OpenDP: mean absolute error at the same epsilon.

    python -m bench.utility_stats [--repeat 200] [--epsilon 1.0]

The diabetes data (scikit-learn, unscaled: 442 patients, age 19-79, BMI 18-42) is uploaded to
an in-process node with public bounds (age [0, 120], BMI [10, 70]); each statistic is
released ``repeat`` times at ``epsilon`` (Laplace, pure DP) by dpnode, with the torch code an
analyst writes, and by OpenDP with its own constructors, and the mean absolute error against
the true value is printed for both, with their ratio (below 1: dpnode is more accurate).

Both sides use the same neighbours: the row count is public and a neighbouring dataset
replaces one patient's row (dpnode's privacy unit; for OpenDP a sized vector domain and a
symmetric distance of 2). A vector's error is the mean over its elements.

Per-group means (``ds.groupby(key).mean("bmi", epsilon=, delta=1e-6)``) and linear
regression coefficients (``sdk.linear_regression``, of the disease progression on age and
BMI, all scaled into [0, 1] by their bounds; the error against least squares on the data)
are Gaussian, and dpnode's only: OpenDP's framework API has no partition combinator or
regression to compare with. Rows the node cannot release yet (median, quartiles) are listed
at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sdk
from bench.utility import PASSWORD, in_process_node

AGE, BMI = (0.0, 120.0), (10.0, 70.0)
BINS = 10


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
            f"mean BMI per {key} ({k} groups, Gaussian)": np.array(
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


#: group-by rows: the key column and its number of groups (dpnode only: OpenDP's framework
#: API has no partition combinator to compare with)
GROUPS = (("sex", 2), ("age_group", 10))
#: the group-by rows' delta (a row is one vector in all the groups' sums and counts: the
#: Gaussian's L2 sensitivity does not grow with the number of groups)
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
    }


def dpnode_group_means(ds: object, epsilon: float) -> dict[str, Callable[[], np.ndarray]]:
    def mean_by(key: str) -> Callable[[], np.ndarray]:
        def release() -> np.ndarray:
            grouped = ds.groupby(key)  # type: ignore[attr-defined]
            means = grouped.mean("bmi", epsilon=epsilon, delta=GROUP_DELTA)
            return np.array(list(means.values()))

        return release

    def regression() -> np.ndarray:
        age, bmi, target = ds["age"], ds["bmi"], ds["target"]  # type: ignore[index]
        x = torch.stack([age / AGE[1], bmi / BMI[1]], dim=1)
        model = sdk.linear_regression(x, target / TARGET[1], epsilon=epsilon, delta=GROUP_DELTA)
        return np.r_[model.coef.numpy(), model.intercept]

    releases = {f"mean BMI per {key} ({k} groups, Gaussian)": mean_by(key) for key, k in GROUPS}
    return {**releases, REGRESSION: regression}


def opendp_releases(data: dict[str, np.ndarray], epsilon: float) -> dict[str, Callable[[], object]]:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    n = len(data["age"])
    age, bmi = list(map(float, data["age"])), list(map(float, data["bmi"]))
    replace_one = 2  # a changed row: one removal and one addition

    def sized(bounds: tuple[float, float]) -> tuple[object, object]:
        return dp.vector_domain(dp.atom_domain(bounds=bounds), size=n), dp.symmetric_distance()

    def laplace(chain: object) -> object:
        return dp.binary_search_chain(
            lambda s: chain >> dp.m.then_laplace(scale=s), d_in=replace_one, d_out=epsilon
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
        "count (age > 50)": lambda: count(above),  # type: ignore[operator]
        "sum (BMI)": lambda: total(bmi),  # type: ignore[operator]
        "mean (BMI)": lambda: mean(bmi),  # type: ignore[operator]
        "variance (BMI)": lambda: variance(bmi),  # type: ignore[operator]
        f"histogram (age, {BINS} bins)": lambda: hist(bins),  # type: ignore[operator]
    }


def _mae(values: list[np.ndarray], truth: np.ndarray) -> float:
    return float(np.mean([np.mean(np.abs(np.asarray(v, dtype=float) - truth)) for v in values]))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    data = load()
    truth = truths(data)
    ours: dict[str, list[np.ndarray]] = {k: [] for k in truth}
    theirs = {
        k: [np.asarray(f()) for _ in range(args.repeat)]
        for k, f in opendp_releases(data, args.epsilon).items()
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
            for _ in range(args.repeat):
                ours[name].append(query().publish(epsilon=args.epsilon).numpy())
        for name, release in dpnode_group_means(ds, args.epsilon).items():
            ours[name] = [release() for _ in range(args.repeat)]
    print(
        f"diabetes, n = {len(data['age'])}, epsilon {args.epsilon:g} (Laplace), "
        f"{args.repeat} releases each; mean absolute error\n"
    )
    print("| statistic | dpnode | OpenDP | dpnode / OpenDP |")
    print("|---|---|---|---|")
    for name, t in truth.items():
        a = _mae(ours[name], t)
        if name in theirs:
            b = _mae(theirs[name], t)
            print(f"| {name} | {a:.4g} | {b:.4g} | {a / b:.2f} |")
        else:
            print(f"| {name} | {a:.4g} | - | - |")
    print("\nNot yet released by dpnode: median, 25/75% quantiles.")


if __name__ == "__main__":
    main()
