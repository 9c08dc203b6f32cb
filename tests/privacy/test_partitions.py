"""Partitions: a row in exactly one cell moves a histogram by 2 (L1), whatever the cells.

Graphs are written as the SDK records one-hot codes and histograms
(``eq(unsqueeze(code, -1), arange(cells))``, products of one-hots along different axes,
casts, sums over the rows). The figures are checked exactly, and then attacked:
neighbouring datasets at the bounds, on every cell, and where the structure is *not* a
partition (two histograms of one row added, products of one-hots that vary along each
other's axes, cells from data-dependent codes), the measured change must stay within
what the tracker charged.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import Graph, GraphBuilder, Ref, plan, run
from dpnode.core.privacy import InputSpec, track
from tests.privacy.helpers import Column, assert_sound, neighbours

N = 40
SQRT2 = math.sqrt(2)


def _onehot(b: GraphBuilder, code: Ref, cells: int, axis: int = 0) -> Ref:
    """``code`` (n,) as a one-hot: (n, cells), or with ``axis`` 1 or 2 (n, cells, 1) or
    (n, 1, cells), ready for an outer product by broadcasting."""
    hot = b.op("eq", b.op("unsqueeze", code, dim=1), b.constant(np.arange(cells)))
    return b.op("unsqueeze", hot, dim=3 - axis) if axis else hot


def _exact(graph: Graph, specs: dict[str, InputSpec]) -> tuple[float, float]:
    o = track(graph, specs).outputs[0]
    return o.exact_l1, o.exact_l2


def _outputs(graph: Graph, data: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(run(plan(graph, accurate=True), data).outputs[0], dtype=np.float64)


@pytest.mark.parametrize("cells", [2, 16, 300, 5000])
def test_a_one_hot_count_is_two_whatever_the_cells(cells: int) -> None:
    b = GraphBuilder()
    code = b.input("k", "int64", (N,))
    hot = b.op("eq", b.op("unsqueeze", code, dim=1), b.constant(np.arange(cells)))
    hist = b.op("sum", b.op("convert_element_type", hot, dtype="float32"), dims=(0,))
    l1, l2 = _exact(b.build([hist]), {"k": InputSpec.private(0, cells - 1)})
    assert (l1, l2) == (2.0, pytest.approx(SQRT2, rel=1e-12))


@pytest.mark.parametrize("keys", [(8, 2), (8, 2, 5), (3, 4, 2, 3)])
def test_an_outer_product_of_one_hots_is_a_partition_of_its_cells(keys: tuple[int, ...]) -> None:
    b = GraphBuilder()
    nd = len(keys)
    prod: Ref | None = None
    specs = {}
    for k, cells in enumerate(keys):
        code = b.input(f"k{k}", "int64", (N,))
        specs[f"k{k}"] = InputSpec.private(0, cells - 1)
        hot = b.op("eq", b.op("unsqueeze", code, dim=1), b.constant(np.arange(cells)))
        shape = [N] + [1] * nd
        shape[k + 1] = cells
        hot = b.op("reshape", b.op("convert_element_type", hot, dtype="int64"), shape=shape)
        prod = hot if prod is None else b.op("mul", prod, hot)
    assert prod is not None
    hist = b.op("reshape", b.op("sum", prod, dims=(0,)), shape=(-1,))
    assert _exact(b.build([hist]), specs) == (2.0, pytest.approx(SQRT2, rel=1e-12))


def test_a_subject_with_several_rows_moves_two_counts_per_row() -> None:
    subjects = np.concatenate([np.zeros(6, dtype=np.int64), np.repeat(np.arange(1, 18), 2)])
    most = int(np.bincount(subjects).max())
    b = GraphBuilder()
    e, s = b.input("e", "int64", (N,)), b.input("s", "int64", (N,))
    outer = b.op("mul", _onehot(b, e, 8, axis=1), _onehot(b, s, 2, axis=2))
    hist = b.op("sum", outer, dims=(0,))
    specs = {"e": InputSpec.private(0, 7, subjects), "s": InputSpec.private(0, 1, subjects)}
    l1, l2 = _exact(b.build([hist]), specs)
    assert most == 6 and l1 == 2.0 * most and l2 == pytest.approx(SQRT2 * most, rel=1e-12)


def test_public_weights_move_by_the_two_largest() -> None:
    weights = np.array([0.5, -3.0, 1.0, 2.5])
    b = GraphBuilder()
    code = b.input("k", "int64", (N,))
    hot = b.op("eq", b.op("unsqueeze", code, dim=1), b.constant(np.arange(4)))
    weighted = b.op("mul", b.op("convert_element_type", hot, dtype="float64"), b.constant(weights))
    graph = b.build([b.op("sum", weighted, dims=(0,))])
    l1, l2 = _exact(graph, {"k": InputSpec.private(0, 3)})
    assert l1 == pytest.approx(5.5, rel=1e-12)
    assert l2 == pytest.approx(math.hypot(3.0, 2.5), rel=1e-12)
    # reached: a row moved from the cell weighted -3 to the cell weighted 2.5
    data = np.zeros(N, dtype=np.int64)
    moved = data.copy()
    data[0], moved[0] = 1, 3
    assert np.abs(_outputs(graph, {"k": data}) - _outputs(graph, {"k": moved})).sum() == 5.5


def test_private_weights_move_by_twice_their_bound_and_reach_it() -> None:
    b = GraphBuilder()
    code, w = b.input("k", "int64", (N,)), b.input("w", "float64", (N,))
    hot = b.op("eq", b.op("unsqueeze", code, dim=1), b.constant(np.arange(8)))
    weighted = b.op(
        "mul", b.op("convert_element_type", hot, dtype="float64"), b.op("unsqueeze", w, dim=1)
    )
    graph = b.build([b.op("sum", weighted, dims=(0,))])
    specs = {"k": InputSpec.private(0, 7), "w": InputSpec.private(0.0, 10.0)}
    report = track(graph, specs)
    assert report.l1 == pytest.approx(20.0, rel=1e-9)  # not 2: a row carries up to 10
    k, w1 = np.zeros(N, dtype=np.int64), np.full(N, 5.0)
    k2, w2 = k.copy(), w1.copy()
    k[0], w1[0], k2[0], w2[0] = 2, 10.0, 6, 10.0
    change = np.abs(_outputs(graph, {"k": k, "w": w1}) - _outputs(graph, {"k": k2, "w": w2}))
    assert change.sum() == 20.0 <= report.l1


def _two_histograms_added() -> tuple[Graph, dict[str, Column]]:
    b = GraphBuilder()
    e, f = b.input("e", "int64", (N,)), b.input("f", "int64", (N,))
    both = b.op("add", _onehot(b, e, 8, axis=0), _onehot(b, f, 8, axis=0))
    graph = b.build([b.op("sum", b.op("convert_element_type", both, dtype="int64"), dims=(0,))])
    return graph, {"e": Column("int64", (N,), 0, 7), "f": Column("int64", (N,), 0, 7)}


def test_two_histograms_of_one_row_added_are_no_partition() -> None:
    graph, cols = _two_histograms_added()
    report = track(graph, {n: c.spec() for n, c in cols.items()})
    # a row moves two counts out of its cells and two in: 4, more than a partition's 2
    e, f = np.zeros(N, dtype=np.int64), np.zeros(N, dtype=np.int64)
    e2, f2 = e.copy(), f.copy()
    e[0], f[0], e2[0], f2[0] = 1, 2, 3, 4
    change = np.abs(_outputs(graph, {"e": e, "f": f}) - _outputs(graph, {"e": e2, "f": f2}))
    assert change.sum() == 4.0 <= report.l1


def _crossed_products() -> tuple[Graph, dict[str, Column]]:
    """``p[i, j, k] = [a[i, k] == j]`` (one nonzero along j for each k) times
    ``q[i, j, k] = [c[i, j] == k]`` (one along k for each j): no partition of the (j, k)
    plane, as neither is broadcast along the other's axis."""
    n = 6
    b = GraphBuilder()
    a, c = b.input("a", "int64", (n, 2)), b.input("c", "int64", (n, 2))
    p = b.op("eq", b.op("unsqueeze", a, dim=1), b.constant(np.arange(2)[:, None]))
    q = b.op("eq", b.op("unsqueeze", c, dim=2), b.constant(np.arange(2)[None, :]))
    hits = b.op("mul", b.op("convert_element_type", p, dtype="int64"), q)
    graph = b.build([b.op("sum", hits, dims=(0,))])
    return graph, {"a": Column("int64", (n, 2), 0, 1), "c": Column("int64", (n, 2), 0, 1)}


def test_products_varying_along_each_others_axes_are_no_partition() -> None:
    graph, cols = _crossed_products()
    report = track(graph, {n: c.spec() for n, c in cols.items()})
    # a[0] = c[0] = [0, 1] hits cells (0, 0) and (1, 1), a[0] = c[0] = [1, 0] the other two
    rows = list(itertools.product([0, 1], repeat=4))
    outs = []
    for r in rows:
        a, c = np.zeros((6, 2), dtype=np.int64), np.zeros((6, 2), dtype=np.int64)
        a[0], c[0] = r[:2], r[2:]
        outs.append(_outputs(graph, {"a": a, "c": c}))
    worst = max(np.abs(x - y).sum() for x, y in itertools.combinations(outs, 2))
    assert worst == 4.0 <= report.l1


def _data_dependent_code() -> tuple[Graph, dict[str, Column]]:
    """Cells from a comparison with the column's own mean: one row moves every row's cell."""
    b = GraphBuilder()
    x = b.input("x", "float64", (8,))
    above = b.op("gt", x, b.op("mean", x))
    code = b.op("convert_element_type", above, dtype="int64")
    hot = b.op("eq", b.op("unsqueeze", code, dim=1), b.constant(np.arange(2)))
    return b.build([b.op("sum", hot, dims=(0,))]), {"x": Column("float64", (8,), 0.0, 1.0)}


def test_cells_from_data_dependent_codes_move_whoever_is_replaced() -> None:
    graph, cols = _data_dependent_code()
    report = track(graph, {n: c.spec() for n, c in cols.items()})
    lo, hi = np.full(8, 0.5), np.full(8, 0.5)
    lo[0], hi[0] = 0.0, 1.0  # the mean moves past every other row: all eight change cells
    change = np.abs(_outputs(graph, {"x": lo}) - _outputs(graph, {"x": hi}))
    assert change.sum() == 12.0 <= report.l1


CASES = {
    "added": _two_histograms_added,
    "crossed": _crossed_products,
    "data-dependent": _data_dependent_code,
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(sorted(CASES)), seed=st.integers(0, 2**32 - 1))
def test_structures_that_are_no_partition_stay_sound(case: str, seed: int) -> None:
    graph, cols = CASES[case]()
    report = track(graph, {n: c.spec() for n, c in cols.items()})
    rng = np.random.default_rng(seed)
    for _ in range(8):
        d1, d2 = neighbours(cols, rng)
        assert_sound(graph, report, d1, d2)


@st.composite
def _partition_graphs(draw: st.DrawFn) -> tuple[Graph, dict[str, Column]]:
    """A histogram of one to three small integer keys with a subject structure, as a product
    of one-hots or as a one-hot of a combined code, optionally weighted and cast."""
    n = draw(st.integers(2, 7))
    subjects = None
    if draw(st.booleans()):
        subjects = np.array(sorted(draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))))
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    b = GraphBuilder()
    cols = {f"k{i}": Column("int64", (n,), 0, m - 1, subjects) for i, m in enumerate(sizes)}
    keys = [b.input(name, "int64", (n,)) for name in cols]
    if draw(st.booleans()):  # a combined code, one-hot over every cell
        code = keys[0]
        for key, m in zip(keys[1:], sizes[1:], strict=True):
            code = b.op("add", b.op("mul", code, m), key)
        if draw(st.booleans()):
            code = b.op("convert_element_type", code, dtype="float32")
        cells = math.prod(sizes)
        hot = b.op("eq", b.op("unsqueeze", code, dim=1), b.constant(np.arange(cells)))
        nd = 2
    else:
        nd = 1 + len(sizes)
        hot = None
        for i, (key, m) in enumerate(zip(keys, sizes, strict=True)):
            one = b.op("eq", b.op("unsqueeze", key, dim=1), b.constant(np.arange(m)))
            shape = [n] + [1] * len(sizes)
            shape[i + 1] = m
            one = b.op("reshape", one, shape=shape)
            hot = (
                one
                if hot is None
                else b.op(draw(st.sampled_from(["mul", "logical_and"])), hot, one)
            )
    assert hot is not None
    out = b.op("convert_element_type", hot, dtype=draw(st.sampled_from(["float32", "int64"])))
    if draw(st.booleans()):
        cols["w"] = Column("float64", (n,), -1.0, 2.0, subjects)
        w = b.input("w", "float64", (n,))
        out = b.op("mul", out, b.op("reshape", w, shape=(n,) + (1,) * (nd - 1)))
    if draw(st.booleans()):
        out = b.op("sum", out, dims=(0,))
    return b.build([out]), cols


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_partition_graphs(), seed=st.integers(0, 2**32 - 1))
def test_partitions_bound_every_neighbour(case: tuple[Graph, dict[str, Column]], seed: int) -> None:
    graph, cols = case
    report = track(graph, {n: c.spec() for n, c in cols.items()})
    rng = np.random.default_rng(seed)
    for _ in range(8):
        d1, d2 = neighbours(cols, rng)
        assert_sound(graph, report, d1, d2)
