"""Sensitivity tracking against the engine's own evaluation, measured in the same run.

    python -m bench.tracking [--rows 1000000] [--lr-rows 100000] [--repeat 7]

For each graph: ``evaluate`` on random data (the computation itself), ``track`` without
data (the free sensitivity query) and ``evaluate_tracked`` (both in one pass, what a
publish runs, with the engine's accurate float64 accumulation), best of ``--repeat``.
The ratio is ``evaluate_tracked / evaluate``: what tracking costs on top of computing.
Quoted in ``docs/sensitivity.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import best
from dpnode.core.engine import Graph, GraphBuilder, evaluate
from dpnode.core.privacy import InputSpec, Subjects, evaluate_tracked, track

Case = tuple[str, Graph, dict[str, InputSpec], dict[str, Any]]


def cases(n: int, m: int, k: int, rng: np.random.Generator) -> list[Case]:
    out: list[Case] = []
    x = rng.uniform(0, 120, n)
    ages = {"x": InputSpec.private(0, 120)}

    b = GraphBuilder()
    xi = b.input("x", "float64", (n,))
    out.append((f"mean of {n:,} rows", b.build([b.op("mean", xi)]), ages, {"x": x}))

    b = GraphBuilder()
    xi = b.input("x", "float64", (n,))
    d = b.op("sub", xi, b.op("mean", xi, dims=[0], keepdim=True))
    var = b.op("div", b.op("sum", b.op("mul", d, d), dims=[0]), float(n - 1))
    out.append((f"variance of {n:,} rows", b.build([var]), ages, {"x": x}))

    b = GraphBuilder()
    xi = b.input("x", "float64", (n,))
    count = b.op("sum", b.op("convert_element_type", b.op("gt", xi, 50.0), dtype="float64"))
    out.append((f"count x > 50 over {n:,} rows", b.build([count]), ages, {"x": x}))

    b = GraphBuilder()
    ui = b.input("u", "int64", (n,))
    onehot = b.op("eq", b.op("unsqueeze", ui, dim=1), b.constant(np.arange(20)))
    hist = b.op("sum", b.op("convert_element_type", onehot, dtype="int64"), dims=[0])
    out.append(
        (
            f"histogram of {n:,} integer rows, 20 bins",
            b.build([hist]),
            {"u": InputSpec.private(0, 19)},
            {"u": rng.integers(0, 20, n)},
        )
    )

    groups = np.sort(rng.integers(0, n // 3, n))
    b = GraphBuilder()
    xi = b.input("x", "float64", (n,))
    out.append(
        (
            f"mean of {n:,} rows, ~3 rows per subject",
            b.build([b.op("mean", xi)]),
            {"x": InputSpec.private(0, 120, Subjects.of(groups))},  # analysed once, as a node does
            {"x": x},
        )
    )

    b = GraphBuilder()
    xs = b.input("X", "float32", (m, k))
    ys = b.input("y", "float32", (m,))
    w = rng.standard_normal(k).astype(np.float32)
    z = b.op("matmul", xs, b.constant(w))
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    residual = b.op("sub", p, ys)
    grad = b.op("div", b.op("matmul", b.op("permute", xs, dims=[1, 0]), residual), float(m))
    features = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    labels = (rng.random(m) < 0.5).astype(np.float32)
    lr = {"X": InputSpec.private(-1, 1), "y": InputSpec.private(0, 1)}
    out.append(
        (
            f"logistic-regression gradient, {m:,} x {k}",
            b.build([grad]),
            lr,
            {"X": features, "y": labels},
        )
    )

    b = GraphBuilder()
    xs = b.input("X", "float32", (m, k))
    gram = b.op("matmul", b.op("permute", xs, dims=[1, 0]), xs)
    out.append((f"X.T @ X, {m:,} x {k}", b.build([gram]), lr, {"X": features}))
    return out


def training_steps(rows: int, rng: np.random.Generator) -> list[Case]:
    """The graph a DP-SGD step publishes (per-example gradients, clipped and summed), as
    the SDK records it, for an MLP and a small transformer on digits-shaped rows (8
    positions of 8 values in [0, 1])."""
    import torch
    import torch.nn.functional as F

    from dpnode.sdk import _per_sample as per_sample
    from dpnode.sdk._remote import graph_for, remote_input

    torch.manual_seed(0)
    models = {
        "MLP (64-32-10)": torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
        ),
        "transformer layer (width 8, 2 heads)": torch.nn.Sequential(
            torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            torch.nn.Flatten(),
            torch.nn.Linear(64, 10),
        ),
    }
    subjects = Subjects.identity(rows)
    specs = {"X": InputSpec.private(0.0, 1.0, subjects), "y": InputSpec.private(0, 9, subjects)}
    data = {
        "X": rng.uniform(0, 1, (rows, 8, 8)).astype(np.float32),
        "y": rng.integers(0, 10, rows),
    }
    out: list[Case] = []
    for name, model in models.items():
        X = remote_input("X", (rows, 8, 8), torch.float32, private=True)
        Y = remote_input("y", (rows,), torch.int64, private=True)
        F.cross_entropy(model(X), Y).backward()
        names = [k for k, _ in model.named_parameters()]
        samples = per_sample.per_example_grads(list(model.parameters()), names)
        graph = graph_for([per_sample.clipped_sum(samples, max_norm=1.0, scale=float(rows))])
        out.append((f"DP-SGD step, {name}, {rows:,} rows", graph, specs, data))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--lr-rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--step-rows", type=int, default=1797, help="rows of the DP-SGD steps (digits: 1797)"
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| graph | evaluate ms | track ms | evaluate_tracked ms | ratio |")
    print("|---|---|---|---|---|")
    every = cases(args.rows, args.lr_rows, args.features, rng)
    every += training_steps(args.step_rows, rng)
    for name, graph, specs, data in every:
        t_eval = best(lambda g=graph, d=data: evaluate(g, d), args.repeat)
        t_track = best(lambda g=graph, s=specs: track(g, s), args.repeat)
        t_both = best(lambda g=graph, d=data, s=specs: evaluate_tracked(g, d, s), args.repeat)
        print(
            f"| {name} | {t_eval * 1e3:.2f} | {t_track * 1e3:.2f} | {t_both * 1e3:.2f} | "
            f"{t_both / t_eval:.2f}x |"
        )


if __name__ == "__main__":
    main()
