"""Tightness: standard queries get their analytic sensitivity (exactly, or within 2x).

Graphs are written the way the SDK decomposes the torch calls (``var`` is
``sum(mul(c, c)) / (n - 1)`` with ``c = x - mean(x, keepdim=True)``). Where the analytic
value is a supremum, a brute-force search over neighbours checks it is also reached.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpnode.core.engine import Graph, GraphBuilder, Ref
from dpnode.core.privacy import InputSpec, track
from tests.privacy.helpers import Column, assert_sound, neighbours

N = 200


def _one(graph_out: tuple[GraphBuilder, Ref], specs: dict[str, InputSpec]) -> tuple[float, float]:
    """The output's L1/L2 sensitivity in exact arithmetic (what tightness is about).

    The bounds a release pays for add the engine's rounding (``tests/privacy/
    test_rounding.py``: about an ulp of a float32 result) and the tracker's own.
    """
    b, ref = graph_out
    o = track(b.build([ref]), specs).outputs[0]
    assert o.l1 == pytest.approx(o.exact_l1 + o.rounding_l1, rel=1e-9)
    assert o.l2 == pytest.approx(o.exact_l2 + o.rounding_l2, rel=1e-9)
    assert o.rounding_l1 <= 1e-4 * o.exact_l1
    return o.exact_l1, o.exact_l2


def _col(dtype: str = "float64", n: int = N) -> tuple[GraphBuilder, Ref]:
    b = GraphBuilder()
    return b, b.input("x", dtype, (n,))


@pytest.mark.parametrize(("a", "hi"), [(0.0, 1.0), (-3.0, 5.0), (18.0, 90.0)])
def test_sum_mean_count_are_exact(a: float, hi: float) -> None:
    spec = {"x": InputSpec.private(a, hi)}
    b, x = _col()
    assert _one((b, b.op("sum", x)), spec) == (hi - a, hi - a)
    b, x = _col()
    l1, l2 = _one((b, b.op("mean", x)), spec)
    assert l1 == pytest.approx((hi - a) / N, rel=1e-12) and l2 == pytest.approx(l1)
    b, x = _col()
    assert _one((b, b.op("sum", b.op("gt", x, (a + hi) / 2))), spec) == (1.0, 1.0)


def test_sum_with_several_rows_per_subject_uses_the_worst_subject() -> None:
    subjects = np.repeat(np.arange(N // 4), 4)
    subjects[:8] = 0  # subject 0 owns rows 0..7 (8 rows)
    b, x = _col()
    l1, _ = _one((b, b.op("sum", x)), {"x": InputSpec.private(-1.0, 2.0, subjects)})
    assert l1 == 8 * 3.0


def test_column_sums_of_a_matrix_add_over_columns() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (N, 3))
    r = track(b.build([b.op("sum", x, dims=(0,))]), {"x": InputSpec.private(0, [1, 2, 4])})
    assert r.outputs[0].exact_l1 == 7.0
    assert r.outputs[0].l2 == pytest.approx(math.sqrt(1 + 4 + 16))


def _histogram(dtype: str, k: int, via: str) -> tuple[GraphBuilder, Ref]:
    b, x = _col(dtype)
    col = b.op("unsqueeze", x, dim=1)
    if via == "eq":
        hit = b.op("eq", col, b.constant(np.arange(k, dtype=np.int64)))
    else:
        edges = np.arange(k + 1, dtype=np.int64) * 3
        hit = b.op(
            "logical_and",
            b.op("ge", col, b.constant(edges[:-1])),
            b.op("lt", col, b.constant(edges[1:])),
        )
    return b, b.op("sum", b.op("convert_element_type", hit, dtype="float32"), dims=(0,))


@pytest.mark.parametrize("via", ["eq", "compare"])
def test_histogram_of_an_integer_column_is_exact(via: str) -> None:
    k = 12
    hi = k - 1 if via == "eq" else 3 * k - 1
    l1, l2 = _one(_histogram("int64", k, via), {"x": InputSpec.private(0, hi)})
    assert l1 == 2.0 and l2 == pytest.approx(math.sqrt(2))


def test_histogram_with_subjects_of_three_rows() -> None:
    subjects = np.repeat(np.arange(N // 4), 4)[:N]
    subjects[N - 1] = subjects[0]  # subject 0: 5 rows
    l1, l2 = _one(_histogram("int64", 6, "eq"), {"x": InputSpec.private(0, 5, subjects)})
    assert l1 == 2.0 * 5  # every row can leave one bin for another
    assert l2 == pytest.approx(math.sqrt(2) * 5)  # all 5 rows may move together


@pytest.mark.parametrize("dt", ["float32", "float64", "float16"])
def test_histogram_of_a_float_column_by_comparisons_is_exact(
    dt: str, rng: np.random.Generator
) -> None:
    b, x = _col(dt)
    col = b.op("unsqueeze", x, dim=1)
    edges = np.linspace(10.0, 70.0, 9)  # bins of a bmi column, public float64 edges
    hit = b.op(
        "logical_and",
        b.op("ge", col, b.constant(edges[:-1])),
        b.op("lt", col, b.constant(edges[1:])),
    )
    out = b.op("sum", hit, dims=(0,))
    r = track(b.build([out]), {"x": InputSpec.private(10.0, 70.0)})
    assert r.outputs[0].exact_l1 == 2.0 and r.outputs[0].l2 == pytest.approx(math.sqrt(2))
    cols = {"x": Column(dt, (N,), 10.0, 70.0)}
    for _ in range(30):
        assert_sound(b.build([out]), r, *neighbours(cols, rng))


def test_histogram_of_a_wide_integer_column_by_comparisons_is_exact() -> None:
    b, x = _col("int64")
    col = b.op("unsqueeze", x, dim=1)
    edges = np.arange(11, dtype=np.int64) * 100_000  # incomes, too many values to tabulate
    hit = b.op(
        "logical_and",
        b.op("ge", col, b.constant(edges[:-1])),
        b.op("lt", col, b.constant(edges[1:])),
    )
    l1, l2 = _one((b, b.op("sum", hit, dims=(0,))), {"x": InputSpec.private(0, 10**6)})
    assert l1 == 2.0 and l2 == pytest.approx(math.sqrt(2))


def test_one_hot_of_a_float_column_after_binning_is_exact() -> None:
    b, x = _col("float32")
    binned = b.op("convert_element_type", b.op("mul", x, 10.0), dtype="int64")
    onehot = b.op("eq", b.op("unsqueeze", binned, dim=1), b.constant(np.arange(10)))
    out = b.op("sum", onehot, dims=(0,))
    l1, l2 = _one((b, out), {"x": InputSpec.private(0.0, 0.99)})
    assert l1 == 2.0 and l2 == pytest.approx(2**0.5)


def _var(b: GraphBuilder, x: Ref, y: Ref | None, correction: int) -> Ref:
    cx = b.op("sub", x, b.op("mean", x, dims=(0,), keepdim=True))
    cy = cx if y is None else b.op("sub", y, b.op("mean", y, dims=(0,), keepdim=True))
    total = b.op("sum", b.op("mul", cx, cy), dims=(0,))
    return b.op("div", total, float(N - correction))


def _brute(graph: Graph, cols: dict[str, Column], trials: int, rng: np.random.Generator) -> float:
    from dpnode.core.engine import evaluate

    best = 0.0
    for _ in range(trials):
        d1, d2 = neighbours(cols, rng)
        a = evaluate(graph, d1)[0]
        c = evaluate(graph, d2)[0]
        best = max(best, float(np.abs(a - c).sum()))
    return best


@pytest.mark.parametrize("correction", [0, 1])
def test_variance_is_exact(correction: int, rng: np.random.Generator) -> None:
    a, hi = 2.0, 7.0
    b, x = _col()
    l1, l2 = _one((b, _var(b, x, None, correction)), {"x": InputSpec.private(a, hi)})
    analytic = (N - 1) / N * (hi - a) ** 2 / (N - correction)
    assert l1 == pytest.approx(analytic, rel=1e-9) and l2 == pytest.approx(l1)
    # the supremum is reached: all others at the midpoint... or at one end, one row jumping
    cols = {"x": Column("float64", (N,), a, hi)}
    graph = b.build([_var(b, x, None, correction)])
    assert _brute(graph, cols, 200, rng) <= l1 * (1 + 1e-9)


def test_covariance_is_exact() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (N,))
    y = b.input("y", "float64", (N,))
    specs = {"x": InputSpec.private(0.0, 2.0), "y": InputSpec.private(-1.0, 4.0)}
    l1, _ = _one((b, _var(b, x, y, 1)), specs)
    # the others all at one corner, one row moving from that corner to the opposite one:
    # the co-moment changes by (n-1)/n * Wx * Wy, the sample covariance by Wx * Wy / n,
    # which the tracked bound reaches exactly
    analytic = 2.0 * 5.0 / N
    assert l1 == pytest.approx(analytic, rel=1e-9)
    graph = b.build([_var(b, x, y, 1)])
    d1 = {"x": np.zeros(N), "y": np.full(N, -1.0)}
    d2 = {"x": np.r_[2.0, np.zeros(N - 1)], "y": np.r_[4.0, np.full(N - 1, -1.0)]}
    from dpnode.core.engine import evaluate

    reached = abs(float(evaluate(graph, d1)[0] - evaluate(graph, d2)[0]))
    assert reached == pytest.approx(analytic, rel=1e-6)


def test_column_variances_of_a_matrix() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (N, 3))
    widths = np.array([1.0, 2.0, 3.0])
    r = track(b.build([_var(b, x, None, 1)]), {"x": InputSpec.private(0.0, widths)})
    per = (N - 1) / N * widths**2 / (N - 1)
    assert r.outputs[0].l1 == pytest.approx(per.sum())
    assert r.outputs[0].l2 == pytest.approx(np.sqrt((per**2).sum()))


def test_features_stacked_from_columns_stay_one_subject_per_row() -> None:
    # ds.tensors("a", "b") stacks columns: X = cat(a[:, None], b[:, None], dim=1)
    b = GraphBuilder()
    cols = [b.input(name, "float32", (N,)) for name in ("a", "b")]
    x = b.op("cat", *(b.op("unsqueeze", c, dim=1) for c in cols), dim=1)
    w = b.constant(np.array([[0.5], [-2.0]], dtype=np.float32))
    out = b.op("sum", b.op("matmul", x, w))
    specs = {"a": InputSpec.private(0.0, 1.0), "b": InputSpec.private(0.0, 1.0)}
    l1, _ = _one((b, out), specs)
    assert l1 == pytest.approx(0.5 + 2.0)  # one row moves both features, |w| each


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 1.0), (-1.0, 1.0)])
def test_normal_equations_within_2x(lo: float, hi: float, rng: np.random.Generator) -> None:
    d, n = 4, 60
    b = GraphBuilder()
    x = b.input("X", "float64", (n, d))
    y = b.input("y", "float64", (n,))
    xt = b.op("permute", x, dims=(1, 0))
    xtx, xty = b.op("matmul", xt, x), b.op("matmul", xt, y)
    specs = {"X": InputSpec.private(lo, hi), "y": InputSpec.private(lo, hi)}
    r = track(b.build([xtx, xty]), specs)
    # analytic: one row x -> x' changes X^T X by x x^T - x' x'^T, X^T y by x y - x' y'
    m = max(abs(lo), abs(hi))
    spread = (hi - lo) * m if lo < 0 else m * m  # largest change of one product x_i x_j
    assert r.outputs[0].l1 <= 2 * d * d * spread and r.outputs[0].l1 >= d * d * spread / 2
    assert r.outputs[1].l1 <= 2 * d * spread
    cols = {"X": Column("float64", (n, d), lo, hi), "y": Column("float64", (n,), lo, hi)}
    for _ in range(50):
        assert_sound(b.build([xtx, xty]), r, *neighbours(cols, rng))
    # reached: all-ones row replaced by all-lows
    assert r.outputs[0].l1 <= 2 * max(d * d * (hi * hi - lo * lo if lo >= 0 else 2 * m * m), 1e-9)
