"""Synthetic data utility: dpnode's MST against MST as its authors publish it, same domain.

    python -m bench.synthetic [--seeds 2] [--rows 5000]

Both run on the same binned tables (``dpnode.core.synth.domain``), at the same (epsilon,
delta), and estimate with the same Private-PGM (``mbi``). dpnode's is the node's: discrete
Gaussian counts, permute-and-flip selections charged as pure epsilon (a tenth of the budget),
its own sampling along the tree. The reference is McKenna et al.'s ``mst.py`` adapted to the
replace-one neighbours (sensitivities doubled): continuous NumPy Gaussian noise (not a safe
sampler: the utility baseline only), rho in thirds, the exponential mechanism accounted as
``eps^2 / 8``-zCDP, and ``mbi``'s own ``synthetic_data``. Printed per table and epsilon: the
average L1 distance between the real and synthetic normalised marginals over every 1- and
2-way marginal (lower is better; "independent" samples each column from its noisy 1-way
marginal, the floor any method should beat), and the wall time ratio against the reference.
"dpnode-aim" is the node's AIM on the same tables (its own NumPy estimation and sampling).

SmartNoise Synth 1.0.8 (the issue's peer) needs ``mbi<2`` and ``opacus<0.15``, which
conflict with this project's pins: comparing with it needs its own environment.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpnode.core.dp import accounting
from dpnode.core.synth import ColumnFacts, domain_of, encode, plan_aim, plan_mst, run_aim, run_mst
from dpnode.core.synth.domain import Attribute
from dpnode.core.synth.estimate import _mbi, estimate_marginals, sample_model, sample_tree
from dpnode.core.synth.mst import marginal

Codes = npt.NDArray[np.int64]


def diabetes() -> tuple[list[ColumnFacts], list[npt.NDArray[np.generic]]]:
    from sklearn.datasets import load_diabetes

    from dpnode.node.demo import _DIABETES_BOUNDS

    data = load_diabetes(scaled=False)
    names = [*data.feature_names, "target"]
    values = [*(data.data[:, i] for i in range(data.data.shape[1])), data.target]
    facts = [ColumnFacts(n, "float64", (), *map(float, _DIABETES_BOUNDS[n])) for n in names]
    return facts, values


def categorical(rows: int) -> tuple[list[ColumnFacts], list[npt.NDArray[np.generic]]]:
    """Eight categorical columns in a chain of dependencies (each a noisy copy of the last)."""
    rng = np.random.default_rng(0)
    sizes = [3, 4, 2, 5, 3, 6, 2, 4]
    values, previous = [], rng.integers(0, sizes[0], rows)
    for j, size in enumerate(sizes):
        keep = rng.random(rows) < 0.7
        column = np.where(keep, previous % size, rng.integers(0, size, rows)) if j else previous
        values.append(column)
        previous = column
    facts = [
        ColumnFacts(f"c{j}", "int64", (), 0.0, s - 1.0, tuple(map(str, range(s))))
        for j, s in enumerate(sizes)
    ]
    return facts, values


def error(real: Codes, synthetic: Codes, sizes: list[int]) -> float:
    """Average L1 distance of the normalised 1- and 2-way marginals."""
    d, out = len(sizes), []
    for k in (1, 2):
        for cols in itertools.combinations(range(d), k):
            shape = [sizes[c] for c in cols]
            p = marginal(real[:, list(cols)], shape) / real.shape[0]
            q = marginal(synthetic[:, list(cols)], shape) / synthetic.shape[0]
            out.append(float(np.abs(p - q).sum()))
    return float(np.mean(out))


def dpnode_mst(attrs: tuple[Attribute, ...], codes: Codes, eps: float, seed: int) -> Codes:
    plan = plan_mst(attrs, rows=codes.shape[0], epsilon=eps, delta=1e-6)
    measured = run_mst(codes, plan)
    root, edges = estimate_marginals(attrs, measured, codes.shape[0])
    sizes = [a.size for a in attrs]
    return sample_tree(sizes, root, edges, codes.shape[0], np.random.default_rng(seed))


def dpnode_aim(attrs: tuple[Attribute, ...], codes: Codes, eps: float, seed: int) -> Codes:
    plan = plan_aim(attrs, rows=codes.shape[0], epsilon=eps, delta=1e-6)
    run = run_aim(codes, plan)
    assert run.model is not None
    return sample_model(run.model, len(attrs), codes.shape[0], seed)


def reference_mst(attrs: tuple[Attribute, ...], codes: Codes, eps: float, seed: int) -> Codes:
    mbi = _mbi()
    from mbi.estimation import MirrorDescent

    rng = np.random.default_rng(seed)
    np.random.seed(seed)  # mbi's synthetic_data draws from NumPy's global generator
    n, d = codes.shape
    sizes = [a.size for a in attrs]
    names = tuple(f"c{i}" for i in range(d))
    rho = accounting.calibrate_rho(eps, 1e-6)
    # replace-one: each marginal's squared L2 sensitivity is 2, the scores' sensitivity 2
    sigma = np.sqrt(2 * 3 / (2 * rho))
    ones = [marginal(codes[:, [j]], [sizes[j]]) for j in range(d)]
    noisy = [x + rng.normal(0, sigma * np.sqrt(d), x.size) for x in ones]
    model = [np.clip(y, 0, None) / max(np.clip(y, 0, None).sum(), 1e-9) for y in noisy]
    pairs = list(itertools.combinations(range(d), 2))
    score = {
        (a, b): np.abs(
            marginal(codes[:, [a, b]], [sizes[a], sizes[b]])
            - np.outer(model[a], model[b]).ravel() * n
        ).sum()
        for a, b in pairs
    }
    parent, chosen = list(range(d)), []

    def find(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    eps_sel = np.sqrt(8 * (rho / 3) / max(d - 1, 1))
    for _ in range(d - 1):
        open_ = [p for p in pairs if find(p[0]) != find(p[1])]
        u = np.array([score[p] for p in open_])
        pick = int(np.argmax(eps_sel * u / (2 * 2) + rng.gumbel(size=u.size)))
        a, b = open_[pick]
        parent[find(a)] = find(b)
        chosen.append((a, b))
    two = [marginal(codes[:, [a, b]], [sizes[a], sizes[b]]) for a, b in chosen]
    sigma2 = sigma * np.sqrt(len(chosen))
    measurements = [
        mbi.LinearMeasurement(y, (names[j],), stddev=sigma * np.sqrt(d))
        for j, y in enumerate(noisy)
    ] + [
        mbi.LinearMeasurement(
            x + rng.normal(0, sigma2, x.size), (names[a], names[b]), stddev=sigma2
        )
        for (a, b), x in zip(chosen, two, strict=True)
    ]
    domain = mbi.Domain(names, tuple(sizes))
    fitted = MirrorDescent().estimate(domain, measurements, known_total=float(n), iters=500)
    columns = fitted.synthetic_data(n).to_dict()
    return np.stack([np.asarray(columns[c]) for c in names], axis=1).astype(np.int64)


def independent(attrs: tuple[Attribute, ...], codes: Codes, eps: float, seed: int) -> Codes:
    plan = plan_mst(attrs, rows=codes.shape[0], epsilon=eps, delta=1e-6)
    measured = run_mst(codes, plan)
    rng = np.random.default_rng(seed)
    columns = []
    for noisy in measured.one_way:
        p = np.clip(noisy, 0, None)
        columns.append(rng.choice(p.size, codes.shape[0], p=p / p.sum()))
    return np.stack(columns, axis=1)


METHODS = {
    "dpnode": dpnode_mst,
    "dpnode-aim": dpnode_aim,
    "reference": reference_mst,
    "independent": independent,
}


def report(seeds: int = 2, rows: int = 5000) -> None:
    tables = {"diabetes": diabetes(), "categorical8": categorical(rows)}
    print(
        f"{'table':<14}{'eps':>5}  " + "".join(f"{m:>22}" for m in METHODS) + "   time dpnode/ref"
    )
    for name, (facts, values) in tables.items():
        attrs = domain_of(facts, len(values[0]))
        codes = np.stack([encode(a, v) for a, v in zip(attrs, values, strict=True)], axis=1)
        sizes = [a.size for a in attrs]
        for eps in (1.0, 4.0):
            errors: dict[str, list[float]] = {m: [] for m in METHODS}
            seconds: dict[str, float] = {m: 0.0 for m in METHODS}
            for seed in range(seeds):
                for method, run in METHODS.items():
                    start = time.perf_counter()
                    synthetic = run(attrs, codes, eps, seed)
                    seconds[method] += time.perf_counter() - start
                    errors[method].append(error(codes, synthetic, sizes))
            cells = "".join(f"{np.mean(e):>14.4f} ± {np.std(e):.4f}" for e in errors.values())
            ratio = seconds["dpnode"] / seconds["reference"]
            print(f"{name:<14}{eps:>5g}  {cells}   {ratio:>8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=5000)
    args = parser.parse_args()
    report(args.seeds, args.rows)


if __name__ == "__main__":
    main()
