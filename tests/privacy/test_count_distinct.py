"""The count_distinct rule: what it charges, and neighbours that try to move the count more.

The claim: replacing one subject moves the count by at most the elements the subject can
change (per group, and twice that over all groups). The attacks reach the charge exactly
(a subject whose rows are all distinct values replaced by copies of a common value, and
the reverse) and random neighbours never pass it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.engine import Graph, GraphBuilder, plan, run
from dpnode.core.privacy import InputSpec, PrivacyReport, track
from tests.privacy.helpers import Column, assert_sound, neighbours

X, G = "dataset:1/x", "dataset:1/g"


def _graph(n: int, dtype: str = "float64", groups: int = 0, cast: str | None = None) -> Graph:
    b = GraphBuilder()
    x = b.input(X, dtype, (n,))
    if cast is not None:
        x = b.op("convert_element_type", x, dtype=cast)
    if not groups:
        return b.build([b.op("count_distinct", x)])
    return b.build([b.op("count_distinct", x, b.input(G, "int64", (n,)), groups=groups)])


def _count(graph: Graph, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return run(plan(graph, accurate=True), inputs).outputs[0].astype(np.float64)


def _report(graph: Graph, specs: dict[str, InputSpec]) -> PrivacyReport:
    return track(graph, specs)


def test_one_row_per_subject_is_charged_one() -> None:
    report = _report(_graph(50), {X: InputSpec.private(0.0, 120.0, None)})
    (out,) = report.outputs
    assert out.l1 == pytest.approx(1.0) and out.l2 == pytest.approx(1.0)
    assert (float(out.lower), float(out.upper)) == pytest.approx((1.0, 50.0))


def test_a_subject_is_charged_its_rows() -> None:
    subjects = np.array([0, 0, 0, 0, 1, 2, 2, 3])
    (out,) = _report(_graph(8), {X: InputSpec.private(0.0, 1.0, subjects)}).outputs
    assert out.l1 == pytest.approx(4.0)
    assert out.per_subject_l1.tolist() == pytest.approx([4.0, 1.0, 2.0, 1.0])


def test_the_count_stays_within_the_values_a_column_can_take() -> None:
    """An integer column in [0, 3] holds at most 4 values, however many rows: so does its
    cast to float32; a charge above the width of [1, 4] would be wasted."""
    subjects = np.repeat(np.arange(10), 10)
    for cast in (None, "float32"):
        g = _graph(100, "int64", cast=cast)
        (out,) = _report(g, {X: InputSpec.private(0, 3, subjects)}).outputs
        assert (float(out.lower), float(out.upper)) == pytest.approx((1.0, 4.0))
        assert out.l1 == pytest.approx(3.0)  # 10 rows, but the count moves in [1, 4]


@pytest.mark.parametrize("direction", ["distinct to copies", "copies to distinct"])
def test_the_worst_neighbours_reach_the_charge_and_no_more(direction: str) -> None:
    """Subject 0 owns rows 0..4. Its rows all distinct and unlike the others', replaced by
    copies of a value the others hold: the count falls by 5. The reverse rises by 5."""
    subjects = np.array([0, 0, 0, 0, 0, 1, 2, 3, 4, 5])
    graph = _graph(10)
    (out,) = _report(graph, {X: InputSpec.private(0.0, 100.0, subjects)}).outputs
    spread = np.array([11.5, 22.5, 33.5, 44.5, 55.5, 7.0, 7.0, 8.0, 8.0, 9.0])
    copies = spread.copy()
    copies[:5] = 7.0
    a, b = (spread, copies) if direction == "distinct to copies" else (copies, spread)
    moved = abs(_count(graph, {X: a}) - _count(graph, {X: b}))
    assert moved == 5.0 and moved <= out.l1 and out.l1 == pytest.approx(5.0)


def test_per_group_a_subject_leaving_one_group_for_another_reaches_twice_its_rows() -> None:
    """Subject 0's two rows hold values no one else holds, in group 0; replaced by two other
    new values in group 1: group 0 loses 2, group 1 gains 2 (L1 4, L2 2 sqrt 2)."""
    subjects = np.array([0, 0, 1, 2, 3, 4])
    graph = _graph(6, groups=2)
    specs = {X: InputSpec.private(0.0, 10.0, subjects), G: InputSpec.private(0, 1, subjects)}
    (out,) = _report(graph, specs).outputs
    x1, g1 = np.array([1.0, 2.0, 5.0, 5.0, 6.0, 6.0]), np.array([0, 0, 0, 1, 0, 1])
    x2, g2 = np.array([3.0, 4.0, 5.0, 5.0, 6.0, 6.0]), np.array([1, 1, 0, 1, 0, 1])
    d = np.abs(_count(graph, {X: x1, G: g1}) - _count(graph, {X: x2, G: g2}))
    assert d.tolist() == [2.0, 2.0]
    assert out.l1 == pytest.approx(4.0) and out.l2 == pytest.approx(2 * math.sqrt(2))


def test_with_a_public_group_index_a_row_moves_one_groups_count() -> None:
    b = GraphBuilder()
    x = b.input(X, "float64", (6,))
    graph = b.build([b.op("count_distinct", x, b.constant(np.arange(6) % 3), groups=3)])
    (out,) = _report(graph, {X: InputSpec.private(0.0, 1.0, None)}).outputs
    assert out.l1 == pytest.approx(1.0)


def test_values_that_may_be_nan_are_charged_the_whole_range() -> None:
    """0 / 0 is NaN: whether an element is NaN is not what its argument's change bounds,
    so any subject may move the count across its range (and NaN counts as one value)."""
    b = GraphBuilder()
    x = b.input(X, "float64", (5,))
    graph = b.build([b.op("count_distinct", b.op("div", x, x))])
    (out,) = _report(graph, {X: InputSpec.private(0.0, 1.0, None)}).outputs
    assert out.l1 >= 4.0  # the width of [1, 5]
    assert float(_count(graph, {X: np.array([0.0, 0.0, 1.0, 0.5, 0.0])})) == 2.0  # NaN, 1


_SUBJECTS = st.lists(st.integers(1, 4), min_size=1, max_size=8).map(
    lambda rows: np.repeat(np.arange(len(rows)), rows)
)


@settings(max_examples=80, deadline=None)
@given(
    subjects=_SUBJECTS,
    dtype=st.sampled_from(["float64", "int64"]),
    groups=st.sampled_from([0, 1, 3, -3]),  # -3: three groups by a public index
    seed=st.integers(0, 2**32 - 1),
)
def test_random_neighbours_never_move_the_count_more_than_charged(
    subjects: np.ndarray, dtype: str, groups: int, seed: int
) -> None:
    n = subjects.size
    cols: dict[str, Any] = {X: Column(dtype, (n,), 0, 3, subjects)}
    rng = np.random.default_rng(seed)
    public: dict[str, np.ndarray] = {}
    specs: dict[str, InputSpec] = {}
    if groups > 0:
        cols[G] = Column("int64", (n,), -1, groups, subjects)  # some rows in no group
    elif groups < 0:
        public[G] = rng.integers(-1, -groups + 1, n)
        specs[G] = InputSpec.public(public[G])
    graph = _graph(n, dtype, abs(groups))
    report = _report(graph, {**{name: c.spec() for name, c in cols.items()}, **specs})
    for _ in range(5):
        d1, d2 = neighbours(cols, rng)
        assert_sound(graph, report, d1, d2, public)
