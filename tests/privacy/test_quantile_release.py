"""Quantiles of private values through a publish's two halves (plan_release, run_release):
what the exponential mechanism is planned with, from public metadata only, and attacks on
its one privacy claim (how many values one subject can move)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.dp import selection
from dpnode.core.engine import Graph, GraphBuilder, plan, run
from dpnode.core.errors import DPNodeError, InvalidRequestError
from dpnode.core.privacy import InputSpec
from dpnode.core.privacy.release import plan_release, run_release
from dpnode.core.privacy.state import PrivacyTrackingError
from tests.privacy.helpers import Column, neighbours
from tests.privacy.test_attack import OPS, Builder, columns

AGE = "dataset:1/age"


def _graph(n: int, *, q: Any = 0.5, how: str = "lower", scale: float | None = None) -> Graph:
    b = GraphBuilder()
    x = b.input(AGE, "float64", (n,))
    if scale is not None:
        x = b.op("mul", x, scale)
    return b.build([b.op("quantile", x, b.constant(np.asarray(q)), interpolation=how)])


def _plan(graph: Graph, specs: dict[str, InputSpec], delta: float | None = None) -> Any:
    return plan_release(plan(graph, accurate=True), specs, epsilon=1.0, delta=delta)


def test_a_median_is_selected_on_a_grid_over_the_public_range() -> None:
    rp = _plan(_graph(200, scale=2.0), {AGE: InputSpec.private(0.0, 120.0, None)})
    assert rp.noise.mechanism == "exponential" and [
        x.sensitivity for x in rp.selection.selections
    ] == [1]
    grid = rp.selection.selections[0].grid
    assert grid[0] == 0.0 and abs(grid[-1] - 240.0) < 1e-6 and grid.size == selection.CANDIDATES
    values = np.random.default_rng(0).uniform(40, 60, 200)
    done = run_release(rp, {AGE: values})
    (got,) = done.values
    assert got.shape == () and got in grid and done.failure is None
    assert abs(float(got) - 2 * np.median(values)) < 30  # epsilon 1, 200 values: close


def test_a_subject_with_several_rows_moves_that_many_values() -> None:
    subjects = np.array([0, 0, 0, 1, 2, 2, 3, 4])  # subject 0 has 3 rows
    rp = _plan(_graph(8), {AGE: InputSpec.private(0.0, 120.0, subjects)})
    assert rp.selection.selections[0].sensitivity == 3


def test_a_value_computed_from_every_row_moves_with_any_subject() -> None:
    b = GraphBuilder()
    x = b.input(AGE, "float64", (10,))
    centred = b.op("sub", x, b.op("mean", x, dims=(0,), keepdim=True))
    g = b.build([b.op("quantile", centred, b.constant(np.asarray(0.5)), interpolation="lower")])
    rp = _plan(g, {AGE: InputSpec.private(0.0, 120.0, None)})
    assert rp.selection.selections[0].sensitivity == 10


def test_several_quantiles_share_the_epsilon() -> None:
    rp = _plan(_graph(50, q=[0.25, 0.5, 0.75], how="linear"), {AGE: InputSpec.private(0, 9, None)})
    sel = rp.selection
    assert sel.count == 3 and all(x.epsilon == pytest.approx(1 / 3) for x in sel.selections)
    assert sel.selections[0].grid.size == selection.CANDIDATES  # float values
    (got,) = run_release(rp, {AGE: np.arange(50.0) % 10}).values
    assert got.shape == (3,)


def test_integer_values_give_integer_candidates() -> None:
    b = GraphBuilder()
    x = b.input("dataset:1/n", "int64", (30,))
    g = b.build([b.op("quantile", x, b.constant(np.asarray(0.5)), interpolation="lower")])
    rp = _plan(g, {"dataset:1/n": InputSpec.private(0, 20, None)})
    assert rp.selection.selections[0].grid.tolist() == [float(v) for v in range(21)]
    (got,) = run_release(rp, {"dataset:1/n": np.arange(30) % 21}).values
    assert float(got).is_integer()


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (  # a quantile that feeds further computation
            lambda b, x, q: [b.op("mul", b.op("quantile", x, q, interpolation="lower"), 2.0)],
            PrivacyTrackingError,
            "released on its own",
        ),
        (  # a quantile published with another result
            lambda b, x, q: [
                b.op("quantile", x, q, interpolation="lower"),
                b.op("sum", x, dims=(0,)),
            ],
            PrivacyTrackingError,
            "separately",
        ),
        (  # quantiles computed from the data
            lambda b, x, q: [b.op("quantile", x, b.op("div", b.op("amax", x, dims=(0,)), 200.0))],
            PrivacyTrackingError,
            "constants",
        ),
        (  # values that may be infinite: no public range to select from
            lambda b, x, q: [b.op("quantile", b.op("div", 1.0, x), q, interpolation="lower")],
            PrivacyTrackingError,
            "unbounded",
        ),
    ],
)
def test_what_cannot_be_selected_is_refused_before_any_value(
    build: Any, error: type, match: str
) -> None:
    b = GraphBuilder()
    x = b.input(AGE, "float64", (20,))
    g = b.build(build(b, x, b.constant(np.asarray(0.5))))
    with pytest.raises(error, match=match):
        _plan(g, {AGE: InputSpec.private(0.0, 120.0, None)})


def test_a_quantile_with_delta_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="without delta"):
        _plan(_graph(20), {AGE: InputSpec.private(0.0, 120.0, None)}, delta=1e-6)


def test_a_quantile_of_public_values_is_their_exact_quantile() -> None:
    b = GraphBuilder()
    x = b.input("model:1/w", "float64", (7,))
    g = b.build([b.op("quantile", x, b.constant(np.asarray(0.5)), interpolation="lower")])
    w = np.array([5.0, 1.0, 4.0, 2.0, 3.0, 7.0, 6.0])
    rp = _plan(g, {"model:1/w": InputSpec.public(w)})
    assert rp.selection is None and rp.noise.grid_exponent is None
    assert run_release(rp, {"model:1/w": w}).values[0] == 4.0


def test_a_failed_evaluation_still_answers_with_a_candidate() -> None:
    rp = _plan(_graph(20), {AGE: InputSpec.private(0.0, 120.0, None)})

    def unreadable() -> dict[str, Any]:
        raise OSError("the column's blob is gone")

    done = run_release(rp, unreadable)
    assert done.failure is not None and done.values[0] in rp.selection.selections[0].grid


def test_a_quantile_of_no_quantiles_is_refused_before_any_value() -> None:
    # an empty q was planned, charged, then failed in the selection (a 500 after the charge)
    with pytest.raises(InvalidRequestError, match="no quantiles"):
        _plan(_graph(20, q=np.zeros(0)), {AGE: InputSpec.private(0.0, 120.0, None)})


def test_a_failed_selection_still_answers_with_the_public_stand_ins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rp = _plan(_graph(20), {AGE: InputSpec.private(0.0, 120.0, None)})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug in the selection")

    monkeypatch.setattr(selection, "select_quantiles", broken)
    done = run_release(rp, {AGE: np.full(20, 30.0)})
    assert done.failure == "ValueError: a bug in the selection"
    assert done.values[0] == rp.fallback[0] == rp.selection.selections[0].grid[0]


# -- the attack: random computations, then a quantile of their result ---------------------


def _quantile_graph(cols: dict[str, Column], data: st.DataObject) -> tuple[Graph, int]:
    """Random computations, then a quantile of one result: of all of it, or per group of the
    private integer column ``u`` (4 groups) when the result has one value per row."""
    g = Builder(data)
    g.inputs(cols)
    g.grow(OPS, 0, 5)
    top = data.draw(st.sampled_from(g.pool))
    q = g.b.constant(np.asarray(data.draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))))
    key = g.pool[2]  # "u", in [0, 3]
    if top.shape == key.shape and data.draw(st.booleans()):
        out = g.b.op("quantile", top.ref, q, key.ref, interpolation="lower", groups=4)
        return g.b.build([out]), 4
    return g.b.build([g.b.op("quantile", top.ref, q, interpolation="lower")]), 0


STATS = {"selected": 0, "grouped": 0, "refused": 0}


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cols=columns(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_no_neighbour_moves_a_score_by_more_than_its_sensitivity(
    cols: dict[str, Column], data: st.DataObject, seed: int
) -> None:
    """The scores move by at most the planned sensitivity between any two neighbouring
    datasets (the exponential mechanism's one claim; per group, the groups' moves added up),
    and neighbours are refused alike."""
    graph, groups = _quantile_graph(cols, data)
    specs = {name: col.spec() for name, col in cols.items()}
    rng = np.random.default_rng(seed)
    d1, d2 = neighbours(cols, rng)
    try:
        rp = plan_release(plan(graph, accurate=True), specs, epsilon=1.0, delta=None)
    except DPNodeError as first:
        with pytest.raises(type(first)) as second:  # decided without the values
            plan_release(plan(graph, accurate=True), specs, epsilon=1.0, delta=None)
        assert str(second.value) == str(first)
        STATS["refused"] += 1
        return
    if rp.selection is None:  # nothing private reached the quantile
        return
    STATS["grouped" if groups else "selected"] += 1
    (one,) = rp.selection.selections
    grid, a, whole = one.grid, one.alpha, 2**selection.ALPHA_BITS
    lo, hi = grid[0], grid[-1]
    scores = []
    for d in (d1, d2):
        outs = run(rp.plan, d).outputs
        flat = np.asarray(outs[0], dtype=np.float64).reshape(-1)
        assert np.all(np.isfinite(flat)) and np.all((flat >= lo) & (flat <= hi))
        index = np.asarray(outs[1]).reshape(-1) if groups else None
        less, greater = selection._counts(flat, grid, index, max(groups, 1))
        scores.append((whole - a) * less.astype(object) - a * greater.astype(object))
    # per group, the most any candidate's score moved; added up over the groups
    moved = sum(
        max(abs(s - t) for s, t in zip(r1, r2, strict=True)) for r1, r2 in zip(*scores, strict=True)
    )
    assert moved <= one.sensitivity * whole
    for d in (d1, d2):
        (got,) = run_release(rp, d).values
        assert np.isfinite(got).all() and np.all((lo <= got) & (got <= hi))


def test_the_attack_reaches_selections() -> None:
    if sum(STATS.values()) < 100:  # ran alone: nothing to judge
        return
    assert STATS["selected"] >= 0.3 * sum(STATS.values()), STATS
    assert STATS["grouped"] >= 0.05 * sum(STATS.values()), STATS


def _cast_median(dt: str, lo: float, hi: float, n: int = 40) -> Any:
    b = GraphBuilder()
    x = b.op("convert_element_type", b.input("dataset:1/n", "int64", (n,)), dtype=dt)
    g = b.build([b.op("quantile", x, b.constant(np.asarray(0.5)), interpolation="linear")])
    return _plan(g, {"dataset:1/n": InputSpec.private(lo, hi, None)})


@pytest.mark.parametrize(
    ("dt", "lo", "hi"),
    [
        ("float64", 1, 99),
        ("float32", 1, 99),
        ("float16", 1, 99),
        ("bfloat16", 1, 99),
        ("float64", 0, 1000),  # a wide column: no table, but still integers
        ("float16", -1000, 1000),  # float16 holds every integer up to 2048
    ],
)
def test_an_integer_column_cast_to_a_float_that_holds_it_keeps_integer_candidates(
    dt: str, lo: int, hi: int
) -> None:
    rp = _cast_median(dt, lo, hi)
    assert rp.selection.selections[0].grid.tolist() == [float(v) for v in range(lo, hi + 1)]
    values = np.random.default_rng(1).integers(lo, hi + 1, 40)
    (got,) = run_release(rp, {"dataset:1/n": values}).values
    assert float(got).is_integer() and lo <= float(got) <= hi


@pytest.mark.parametrize(("dt", "hi"), [("bfloat16", 1000), ("float16", 5000)])
def test_a_cast_that_rounds_integers_selects_over_the_grid(dt: str, hi: int) -> None:
    """Beyond 256 (bfloat16) or 2048 (float16) the cast rounds: its values are not the
    column's integers, and the candidates are the grid over the range."""
    assert _cast_median(dt, 0, hi).selection.selections[0].grid.size == selection.CANDIDATES


def test_values_known_to_a_table_are_the_candidates() -> None:
    """A choice between two public values by a comparison of a float column can only be
    one of them: the threshold table knows it."""
    b = GraphBuilder()
    x = b.input(AGE, "float64", (30,))
    chosen = b.op("where", b.op("gt", x, 50.0), 0.25, 0.75)
    q = b.constant(np.asarray([0.25, 0.5]))
    g = b.build([b.op("quantile", chosen, q, interpolation="linear")])
    rp = _plan(g, {AGE: InputSpec.private(0.0, 120.0, None)})
    assert rp.selection.selections[0].grid.tolist() == [0.25, 0.75]
    (got,) = run_release(rp, {AGE: np.linspace(0, 120, 30)}).values
    assert set(got.tolist()) <= {0.25, 0.75}


def test_a_grouped_quantile_of_a_cast_column_keeps_integer_candidates() -> None:
    b = GraphBuilder()
    x = b.op("convert_element_type", b.input("dataset:1/n", "int64", (12,)), dtype="float32")
    index = b.constant(np.arange(12) % 3)
    q = b.constant(np.asarray(0.5))
    g = b.build([b.op("quantile", x, q, index, interpolation="linear", groups=3)])
    rp = _plan(g, {"dataset:1/n": InputSpec.private(0, 9, None)})
    assert rp.selection.selections[0].grid.tolist() == [float(v) for v in range(10)]
