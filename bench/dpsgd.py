"""DP-SGD's clipping prim vs hand-written NumPy and local torch: time ratios.

Run: ``python -m bench.dpsgd`` (add ``--quick`` for smaller inputs).

``clip_by_subject_norm`` clips each group's summed rows to L2 norm C and adds the
clipped vectors. The baselines do the same in one process: NumPy as a competent
person would write it in the input's dtype (a sort and ``np.add.reduceat`` for the
groups, then norms and a weighted sum; ``np.add.at`` would be several times slower),
and torch's per-sample clipping as Opacus does it (norms, clamp, sum; rows only, torch
has no grouping step). The engine computes in float64 whatever the input (one copy),
plans the graph and checks its quotas. Time is the best of several runs. Ratios > 1
mean the engine is slower.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import best
from dpnode.core.engine import GraphBuilder, evaluate

Array = np.ndarray[Any, Any]
C = 1.0


def engine(x: Array, groups: Array) -> Callable[[], Array]:
    b = GraphBuilder()
    xi = b.input("x", str(x.dtype), x.shape)
    gi = b.input("g", "int64", groups.shape)
    graph = b.build([b.op("clip_by_subject_norm", xi, gi, max_norm=C)])
    return lambda: evaluate(graph, {"x": x, "g": groups})[0]


def numpy(x: Array, groups: Array) -> Callable[[], Array]:
    def run() -> Array:
        rows = x
        if len(np.unique(groups)) != len(groups):  # sum each group's rows: sort, reduceat
            order = np.argsort(groups, kind="stable")
            g = groups[order]
            starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
            rows = np.add.reduceat(x[order], starts, axis=0)
        norms = np.linalg.norm(rows, axis=1)
        scale = np.minimum(1.0, C / np.maximum(norms, 1e-30)).astype(x.dtype)
        return scale @ rows

    return run


def torch_rows(x: Array) -> Callable[[], Any]:
    import torch

    t = torch.from_numpy(x)

    def run() -> Any:
        norms = torch.linalg.vector_norm(t, dim=1)
        return (t * torch.clamp(C / norms, max=1.0).unsqueeze(1)).sum(dim=0)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    rng = np.random.default_rng(0)
    cases = [
        ("logistic regression, one row per subject", 100_000 // scale, 21, 1),
        ("same, 3 rows per subject", 100_000 // scale, 21, 3),
        ("MLP, 1,000 parameters", 10_000 // scale, 1_000, 1),
    ]
    print("| case | n x P | engine | NumPy | engine / NumPy | torch (rows) |")
    print("|---|---|---|---|---|---|")
    for name, n, p, per in cases:
        x = rng.normal(0, 1, (n, p)).astype(np.float32)
        groups = rng.permutation(np.arange(n) // per).astype(np.int64)
        eng, ref = engine(x, groups), numpy(x, groups)
        np.testing.assert_allclose(eng(), ref(), rtol=1e-4, atol=1e-3 * np.sqrt(n))
        te, tn = best(eng, args.repeat), best(ref, args.repeat)
        tt = f"{best(torch_rows(x), args.repeat) * 1e3:.1f} ms" if per == 1 else "-"
        print(
            f"| {name} | {n:,} x {p:,} | {te * 1e3:.1f} ms | {tn * 1e3:.1f} ms | "
            f"{te / tn:.2f}x | {tt} |"
        )


if __name__ == "__main__":
    main()
