"""Engine vs hand-written NumPy on realistic graphs: time and peak memory ratios.

Run: ``python -m bench.engine`` (add ``--quick`` for smaller inputs).

Each case builds the prim graph the SDK would send (torch's decompositions:
mean as sum/numel, std via the sum of squared deviations, sigmoid as
1/(1+exp(-z))) and the NumPy a competent person would write for the same
result. Time is the best of several runs (planning included for the engine);
peak memory is tracemalloc's peak above the inputs during one run (NumPy
reports its buffers to tracemalloc). Ratios > 1 mean the engine is slower or
bigger. Targets: time <= 1.2x, memory <= 1.5x.
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import interleaved_best
from dpnode.core.engine import Graph, GraphBuilder, Ref, evaluate

Array = np.ndarray[Any, Any]


def standardise(
    n: int, k: int
) -> tuple[Graph, dict[str, Array], Callable[[dict[str, Array]], Any]]:
    b = GraphBuilder()
    x = b.input("x", "float32", (n, k))

    def mean0(t: Ref) -> Ref:
        return b.op("div", b.op("sum", t, dims=[0], keepdim=True), float(n))

    m = mean0(x)
    d = b.op("sub", x, m)
    var = b.op("div", b.op("sum", b.op("mul", d, d), dims=[0], keepdim=True), float(n - 1))
    out = b.op("div", b.op("sub", x, m), b.op("sqrt", var))
    g = b.build([out])

    def ref(inp: dict[str, Array]) -> Any:
        xv = inp["x"]
        return (xv - xv.mean(0)) / xv.std(0, ddof=1)

    return g, {"x": np.random.default_rng(0).standard_normal((n, k), dtype=np.float32)}, ref


def covariance(n: int, k: int) -> tuple[Graph, dict[str, Array], Callable[[dict[str, Array]], Any]]:
    b = GraphBuilder()
    x = b.input("x", "float32", (n, k))
    m = b.op("div", b.op("sum", x, dims=[0], keepdim=True), float(n))
    xc = b.op("sub", x, m)
    cov = b.op("div", b.op("matmul", b.op("permute", xc, dims=[1, 0]), xc), float(n - 1))
    g = b.build([cov])

    def ref(inp: dict[str, Array]) -> Any:
        xv = inp["x"]
        xc = xv - xv.mean(0)
        return xc.T @ xc / (n - 1)

    return g, {"x": np.random.default_rng(1).standard_normal((n, k), dtype=np.float32)}, ref


def logistic_grad(
    n: int, k: int
) -> tuple[Graph, dict[str, Array], Callable[[dict[str, Array]], Any]]:
    b = GraphBuilder()
    x = b.input("x", "float32", (n, k))
    y = b.input("y", "float32", (n,))
    w = b.input("w", "float32", (k,))
    z = b.op("matmul", x, w)
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    grad = b.op("div", b.op("matmul", b.op("permute", x, dims=[1, 0]), b.op("sub", p, y)), float(n))
    g = b.build([grad])
    rng = np.random.default_rng(2)
    inputs = {
        "x": rng.standard_normal((n, k), dtype=np.float32),
        "y": (rng.random(n) < 0.5).astype(np.float32),
        "w": rng.standard_normal(k, dtype=np.float32),
    }

    def ref(inp: dict[str, Array]) -> Any:
        xv, yv, wv = inp["x"], inp["y"], inp["w"]
        pv = 1.0 / (1.0 + np.exp(-(xv @ wv)))
        return xv.T @ (pv - yv) / n

    return g, inputs, ref


def _np_conv2d(x: Array, w: Array, bias: Array, stride: int, pad: int) -> Array:
    """A competent NumPy conv2d: windows of the padded input contracted by tensordot."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    out = np.tensordot(win, w, axes=((1, 4, 5), (1, 2, 3)))  # (N, H, W, O)
    return np.moveaxis(out, -1, 1) + bias[:, None, None]


def conv_net(batch: int) -> tuple[Graph, dict[str, Array], Callable[[dict[str, Array]], Any]]:
    rng = np.random.default_rng(3)
    inputs = {
        "x": rng.standard_normal((batch, 3, 32, 32), dtype=np.float32),
        "w1": rng.standard_normal((16, 3, 3, 3), dtype=np.float32) * 0.2,
        "b1": rng.standard_normal(16, dtype=np.float32),
        "w2": rng.standard_normal((32, 16, 3, 3), dtype=np.float32) * 0.1,
        "b2": rng.standard_normal(32, dtype=np.float32),
        "fc": rng.standard_normal((32, 10), dtype=np.float32),
        "fb": rng.standard_normal(10, dtype=np.float32),
    }
    b = GraphBuilder()
    r = {k: b.input(k, "float32", v.shape) for k, v in inputs.items()}
    h = b.op(
        "convolution", r["x"], r["w1"], r["b1"], stride=[1, 1], padding=[1, 1], dilation=[1, 1]
    )
    h = b.op("maximum", h, 0.0)
    h = b.op("convolution", h, r["w2"], r["b2"], stride=[2, 2], padding=[1, 1], dilation=[1, 1])
    h = b.op("maximum", h, 0.0)
    h = b.op("mean", h, dims=[2, 3])
    out = b.op("add", b.op("matmul", h, r["fc"]), r["fb"])
    g = b.build([out])

    def ref(inp: dict[str, Array]) -> Any:
        hv = np.maximum(_np_conv2d(inp["x"], inp["w1"], inp["b1"], 1, 1), 0)
        hv = np.maximum(_np_conv2d(hv, inp["w2"], inp["b2"], 2, 1), 0)
        return hv.mean(axis=(2, 3)) @ inp["fc"] + inp["fb"]

    return g, inputs, ref


def _peak(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs (CI smoke run)")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    n = 100_000 if args.quick else 1_000_000
    cases = {
        f"standardise {n:,} x 20 float32": standardise(n, 20),
        f"covariance {n:,} x 20 float32": covariance(n, 20),
        f"logistic-regression gradient {n:,} x 20": logistic_grad(n, 20),
        f"conv net forward, batch {16 if args.quick else 64} x 3 x 32 x 32": conv_net(
            16 if args.quick else 64
        ),
    }
    print(
        "| case | engine ms | numpy ms | time ratio "
        "| engine peak MB | numpy peak MB | memory ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (graph, inputs, ref) in cases.items():
        got = evaluate(graph, inputs)[0]
        want = ref(inputs)
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
        te, tn = interleaved_best(
            [lambda: evaluate(graph, inputs), lambda: ref(inputs)],  # noqa: B023
            args.repeat,
        )
        me = _peak(lambda: evaluate(graph, inputs))  # noqa: B023
        mn = _peak(lambda: ref(inputs))  # noqa: B023
        print(
            f"| {name} | {te * 1e3:.1f} | {tn * 1e3:.1f} | {te / tn:.2f}x | "
            f"{me / 2**20:.1f} | {mn / 2**20:.1f} | {me / max(mn, 1):.2f}x |"
        )


if __name__ == "__main__":
    main()
