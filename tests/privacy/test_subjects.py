"""The subject-structure fast paths give the general paths' sensitivities, and stay sound.

``dpnode.core.privacy.subjects`` recognises owner arrays that are views of a subject column and
lets reductions and per-subject bounds use the column's structure. Here the same graphs
are tracked with the fast paths and with :func:`general_paths` (every owner array
treated as an arbitrary array): the reports must agree (up to float rounding in sums,
never smaller), and neighbouring datasets must stay within them, for identity, sorted
(contiguous) and unsorted subject indexes with gaps in their ids.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder
from dpnode.core.errors import EvaluationError
from dpnode.core.privacy import InputSpec, PrivacyReport, PrivacyTrackingError, track
from dpnode.core.privacy.arrays import varying_axes
from dpnode.core.privacy.subjects import (
    Subjects,
    distinct_view,
    general_paths,
    increasing_flat,
    register_distinct,
    rows_of,
)
from tests.privacy.helpers import Column, assert_sound, neighbours
from tests.privacy.test_attack import random_graph


def _same(fast: PrivacyReport, slow: PrivacyReport) -> None:
    assert fast.subjects == slow.subjects
    for f, s in zip(fast.outputs, slow.outputs, strict=True):
        for a, b in ((f.l1, s.l1), (f.l2, s.l2)):
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12)
        n = slow.subjects
        for a, b in ((f.per_subject_l1, s.per_subject_l1), (f.per_subject_l2, s.per_subject_l2)):
            np.testing.assert_allclose(
                np.broadcast_to(a, (n,)), np.broadcast_to(b, (n,)), rtol=1e-9, atol=1e-12
            )
        # bounds on computed values add rounding allowances summed in either path's order
        np.testing.assert_allclose(f.lower, s.lower, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(f.upper, s.upper, rtol=1e-9, atol=1e-12)
    assert fast.l1 == pytest.approx(slow.l1, rel=1e-9, abs=1e-12)
    assert fast.l2 == pytest.approx(slow.l2, rel=1e-9, abs=1e-12)


@st.composite
def subject_index(draw: st.DrawFn, n: int) -> np.ndarray | None:
    kind = draw(st.sampled_from(["identity", "sorted", "unsorted"]))
    if kind == "identity":
        return None
    ids = np.array(draw(st.lists(st.integers(0, n + 2), min_size=n, max_size=n)))
    return np.sort(ids) if kind == "sorted" else ids


@st.composite
def columns(draw: st.DrawFn) -> dict[str, Column]:
    n = draw(st.integers(2, 7))
    d = draw(st.integers(1, 3))
    subjects = draw(subject_index(n))
    lo = np.array(draw(st.lists(st.floats(-3, 3), min_size=d, max_size=d)))
    width = np.array(draw(st.lists(st.floats(0, 3), min_size=d, max_size=d)))
    return {
        "x": Column("float64", (n, d), lo, lo + width, subjects),
        "y": Column("float64", (n,), -1.0, 2.0, subjects),
        "u": Column("int64", (n,), 0, 3, subjects),
    }


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cols=columns(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_fast_paths_match_the_general_paths_and_are_sound(
    cols: dict[str, Column], data: st.DataObject, seed: int
) -> None:
    graph = random_graph(cols, data, max_ops=5)
    specs = {name: col.spec() for name, col in cols.items()}
    try:
        with general_paths():
            slow = track(graph, specs)
    except PrivacyTrackingError:
        with pytest.raises(PrivacyTrackingError):
            track(graph, specs)
        return
    fast = track(graph, specs)
    _same(fast, slow)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        d1, d2 = neighbours(cols, rng)
        try:
            assert_sound(graph, fast, d1, d2)
        except EvaluationError:
            return


@pytest.mark.parametrize("kind", ["identity", "sorted", "unsorted"])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_row_reductions_take_the_fast_path_and_agree(
    rng: np.random.Generator, kind: str, op: str
) -> None:
    n, d = 500, 4
    subjects = {
        "identity": None,
        "sorted": np.sort(rng.integers(0, 200, n)),
        "unsorted": rng.integers(0, 200, n),
    }[kind]
    b = GraphBuilder()
    x = b.input("x", "float64", (n, d))
    y = b.input("y", "float64", (n,))
    u = b.input("u", "int64", (n,))
    centred = b.op("sub", x, b.op("mean", x, dims=[0], keepdim=True))
    outs = [
        b.op(op, x, dims=[0]),  # per column, over rows
        b.op(op, x),  # everything
        b.op(op, b.op("mul", y, 3.0)),  # an elementwise op keeps the subject column
        b.op(op, b.op("matmul", x, b.constant(rng.normal(size=d)))),  # rows through X @ w
        b.op(op, b.op("mul", x, b.constant(rng.uniform(0, 2, (n, 1)))), dims=[0]),  # L by row
        b.op("matmul", b.op("permute", x, dims=[1, 0]), y),  # X.T @ y: one column, both sides
        b.op("matmul", b.constant(rng.normal(size=n)), x),  # w @ X: a public side
        b.op("matmul", b.op("permute", x, dims=[1, 0]), x),  # X.T @ X
        b.op("sum", b.op("mul", centred, centred), dims=[0]),  # a centred moment (variance)
        b.op("sub", y, b.op("amax", y)),  # a column and a mixed value: keeps the column
        b.op(op, b.op("mul", b.op("sub", y, b.op("amax", y)), y)),
        b.op(op, b.op("convert_element_type", b.op("gt", y, 2.5), dtype="float64")),  # a count
        b.op("sum", b.op("eq", b.op("unsqueeze", u, dim=1), b.constant(np.arange(4))), dims=[0]),
        b.op(op, b.op("convert_element_type", u, dtype="float64")),  # an integer column's mean
    ]
    graph = b.build(outs)
    specs = {
        "x": InputSpec.private(rng.uniform(-1, 0, d), rng.uniform(0, 2, d), subjects),
        "y": InputSpec.private(0, 5, subjects),
        "u": InputSpec.private(0, 3, subjects),
    }
    with general_paths():
        slow = track(graph, specs)
    fast = track(graph, specs)
    _same(fast, slow)
    if kind == "identity":  # nothing of size n per subject was formed
        assert all(o.per_subject_l1.shape == (1,) for o in fast.outputs[:3])
        assert all(o.per_subject_l1.shape == (1,) for o in fast.outputs[-3:])


def test_distinct_ids_are_recognised_by_layout() -> None:
    ids = register_distinct(np.arange(12, dtype=np.int64).reshape(3, 4) + 100)
    assert not ids.flags.writeable
    assert increasing_flat(ids.reshape(-1))
    assert not increasing_flat(ids.reshape(-1)[::-1])  # reversed: distinct, not increasing
    assert not increasing_flat(ids[1:].reshape(-1))  # not all of them
    assert distinct_view(ids.T) and not distinct_view(ids.copy())
    assert varying_axes(np.broadcast_to(ids[:, :1], (3, 5)), (3, 5), exact=True) == [True, False]
    with general_paths():
        assert not increasing_flat(ids.reshape(-1))


def test_subject_structures() -> None:
    s = Subjects.of(np.array([3, 3, 0, 5, 0]))
    assert (s.count, s.distinct, s.contiguous, s.max_rows) == (6, False, False, 2)
    np.testing.assert_array_equal(s.counts, [2, 0, 0, 2, 0, 1])
    np.testing.assert_array_equal(s.per_subject(np.arange(5.0)), [6, 0, 0, 1, 0, 3])
    np.testing.assert_array_equal(s.spread(s.counts, 8), [2, 0, 0, 2, 0, 1, 0, 0])
    c = Subjects.of(np.array([1, 1, 4, 4, 4]))
    assert (c.contiguous, c.max_rows) == (True, 3)
    np.testing.assert_array_equal(c.per_subject(np.arange(5.0)), [0, 1, 0, 0, 9])
    i = Subjects.identity(3)
    assert i is Subjects.identity(3) and not i.column.flags.writeable
    np.testing.assert_array_equal(i.per_subject(np.array([2.0])), [2.0])
    np.testing.assert_array_equal(i.spread(i.per_subject(np.array([2.0])), 5), [2, 2, 2, 0, 0])
    for bad in (np.array([0, -1]), np.array([0, 2**63 + 5], dtype=np.uint64)):
        with pytest.raises(ValueError, match="non-negative"):
            Subjects.of(bad)


def test_only_views_of_the_column_are_recognised() -> None:
    s = Subjects.of(np.array([0, 0, 1, 2]))
    col = s.column.reshape(4, 1)
    assert rows_of(np.broadcast_to(col, (4, 3)), (4, 3)) is not None
    assert rows_of(col.T, (2, 4)) is not None  # laid along axis 1
    assert rows_of(col.copy(), (4, 3)) is None  # same values, not the column: general path
    assert rows_of(col[::-1], (4, 3)) is None  # reordered rows
    assert rows_of(col[1:], (3, 3)) is None  # a slice
    assert rows_of(col, (0, 3)) is None  # empty
    assert rows_of(col.view(np.uint64), (4, 3)) is None  # the same bytes read as another dtype
    mutable = np.array([0, 1, 2])
    t = Subjects.of(mutable)
    assert t.column is not mutable and not t.column.flags.writeable  # copied, read-only
    with general_paths():
        assert rows_of(np.broadcast_to(col, (4, 3)), (4, 3)) is None


def test_paged_identity_columns_are_the_identity_recognised_without_reading() -> None:
    import mmap as mmap_module

    from dpnode.core.engine import plan
    from dpnode.core.privacy.subjects import PagedIdentities, Subjects, rows_of

    paged = PagedIdentities(keep=2)
    n = 5000
    s = paged.identity(n)
    assert s.is_identity and (s.count, s.max_rows) == (n, 1)
    np.testing.assert_array_equal(s.column, np.arange(n))
    base = s.column.base
    assert isinstance(base, memoryview) and isinstance(base.obj, mmap_module.mmap)
    assert not s.column.flags.writeable
    with pytest.raises(ValueError):
        s.column.setflags(write=True)
    assert paged.identity(n) is s
    shorter = paged.identity(n - 7)  # a prefix of the same file
    np.testing.assert_array_equal(shorter.column, np.arange(n - 7))
    longer = paged.identity(2 * n)  # a new file
    np.testing.assert_array_equal(longer.column, np.arange(2 * n))
    np.testing.assert_array_equal(s.column, np.arange(n))  # the old file is still mapped
    rows = rows_of(s.column.reshape(n, 1), (n, 3))
    assert rows is not None and rows.subjects is s and rows.axis == 0

    # the tracker says the same with either column, for means, variances and counts
    for op in ("mean", "var", "count"):
        b = GraphBuilder()
        x = b.input("x", "float64", (n,))
        if op == "var":
            m = b.op("mean", x, dims=[0], keepdim=True)
            d = b.op("sub", x, m)
            out = b.op("mean", b.op("mul", d, d))
        elif op == "count":
            out = b.op("sum", b.op("gt", x, 0.5))
        else:
            out = b.op("mean", x)
        planned = plan(b.build([out]), accurate=True)
        in_memory = Subjects.of(np.arange(n))
        reports = [
            track(planned, {"x": InputSpec.private(0.0, 1.0, subjects)})
            for subjects in (s, in_memory)
        ]
        assert reports[0].l1 == reports[1].l1 and reports[0].l2 == reports[1].l2, op
