"""Tracking once per structure (dpnode.core.privacy.cache): a report tracked with the changing
constants as public boxes holds for every value inside them, and the cache reuses it only
for such values, with every other constant unchanged."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import Graph, GraphBuilder, plan
from dpnode.core.engine.graph import Node
from dpnode.core.privacy import InputSpec, PrivacyTrackingError, track
from dpnode.core.privacy.cache import TrackingCache
from tests.privacy.helpers import Column, assert_sound, neighbours
from tests.privacy.test_attack import OPS, Builder, columns

N, D = 40, 5


def _dpsgd(w: np.ndarray, mask: np.ndarray | None = None) -> Graph:
    """Logistic regression's per-example gradients, clipped and summed (a training step)."""
    b = GraphBuilder()
    x, y = b.input("x", "float64", (N, D)), b.input("y", "float64", (N,))
    z = b.op("squeeze", b.op("matmul", x, b.constant(w.reshape(D, 1))), dims=(1,))
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    r = b.op("unsqueeze", b.op("sub", p, y), dim=1)
    if mask is not None:
        r = b.op("mul", r, b.constant(mask))
    grads = b.op("mul", r, x)
    return b.build([b.op("clip_by_subject_norm", grads, b.constant(np.arange(N)), max_norm=1.0)])


SPECS = {"x": InputSpec.private(-1.0, 1.0), "y": InputSpec.private(0.0, 1.0)}


def _planned(graph: Graph) -> Any:
    return plan(graph, accurate=True)


def test_a_training_loop_is_tracked_once_every_few_steps() -> None:
    cache = TrackingCache()
    rng = np.random.default_rng(0)
    w = rng.normal(size=D)
    reports = []
    for _ in range(12):
        reports.append(cache.report(_planned(_dpsgd(w)), SPECS))
        w = w + rng.uniform(-0.05, 0.05, D)  # an optimizer's step
    # the first two are tracked (the second learns which constant moves, and boxes it)
    assert cache.tracked < 6 and cache.hits == 12 - cache.tracked
    exact = track(_planned(_dpsgd(w)), SPECS)
    for r in reports:
        assert r.l2 <= exact.l2 * (1 + 1e-6) and math.isclose(r.l2, 2.0, rel_tol=1e-3)


def test_a_box_too_wide_for_the_graph_is_narrowed_and_a_box_that_holds_widened() -> None:
    """Rows ``x * log(w)``: a box of 8 steps around ``w = 0.06`` reaches below 0, where log
    leaves its domain, and the boxed tracking is refused; one of 4 steps holds. The cache
    narrows the box instead of tracking every step exactly, and a loop that then steps
    steadily is tracked less and less often as boxes that hold are widened."""

    def rows(w: np.ndarray) -> Graph:
        b = GraphBuilder()
        x = b.input("x", "float64", (N, D))
        r = b.op("mul", x, b.op("log", b.constant(w)))
        return b.build([b.op("clip_by_subject_norm", r, b.constant(np.arange(N)), max_norm=1.0)])

    specs = {"x": SPECS["x"]}
    cache = TrackingCache()
    w = np.full(D, 0.05)
    misses = []
    for _ in range(60):
        before = cache.tracked
        report = cache.report(_planned(rows(w)), specs)
        misses.append(cache.tracked > before)
        assert report.l2 == pytest.approx(2.0, rel=1e-6)
        w = w + 0.01
    # tracked at steps 1 and 2 (the box of 8 refused), then boxes of 4, 8, 16, 32 and 64
    # steps hold (each tracked once more at its end), instead of all 60
    assert sum(misses) <= 8, misses
    assert not any(misses[-25:])


def test_a_constant_outside_its_box_or_another_changed_constant_is_tracked_again() -> None:
    cache = TrackingCache()
    w, mask = np.full(D, 0.5), np.ones((N, 1))
    for step in (0.0, 0.01, 0.02):
        cache.report(_planned(_dpsgd(w + step, mask)), SPECS)
    tracked = cache.tracked
    cache.report(_planned(_dpsgd(w + 0.03, mask)), SPECS)
    assert cache.tracked == tracked  # inside the box
    cache.report(_planned(_dpsgd(w + 5.0, mask)), SPECS)
    assert cache.tracked == tracked + 1  # far outside it
    half = mask.copy()
    half[::2] = 0.5
    cache.report(_planned(_dpsgd(w + 5.0, half)), SPECS)
    assert cache.tracked == tracked + 2  # a constant that was not boxed changed
    other = {"x": InputSpec.private(-2.0, 2.0), "y": SPECS["y"]}
    r = cache.report(_planned(_dpsgd(w + 5.0, half)), other)
    assert cache.tracked == tracked + 3  # other inputs' metadata: another entry
    assert r.l2 == pytest.approx(track(_planned(_dpsgd(w + 5.0, half)), other).l2)


def test_a_refused_graph_is_refused_every_time() -> None:
    cache = TrackingCache()
    b = GraphBuilder()
    x = b.input("x", "float64", (N, D))
    bad = b.build([b.op("reciprocal", b.op("sum", x, dims=(0,)))])  # a sum that may be 0
    for _ in range(3):
        with pytest.raises(PrivacyTrackingError):
            cache.report(_planned(bad), SPECS)
    assert cache.hits == 0


def _with_constants(graph: Graph, values: dict[int, np.ndarray]) -> Graph:
    nodes = [
        replace(n, value=values[i].astype(n.value.dtype))
        if i in values and n.value is not None
        else n
        for i, n in enumerate(graph.nodes)
    ]
    return Graph(tuple(Node(n.op, n.args, n.attrs, n.value) for n in nodes), graph.outputs)


STATS = {"no constant": 0, "refused": 0, "checked": 0}


def _graph_with_constants(cols: dict[str, Any], data: st.DataObject) -> Graph:
    """The attack's random ops after a product with a constant matrix and a constant
    vector (a model's weights), with two outputs."""
    g = Builder(data)
    g.inputs(cols)
    x, y = g.pool[0], g.pool[1]
    k = data.draw(st.integers(1, 3))
    w = data.draw(st.lists(st.floats(-2, 2), min_size=x.shape[1] * k, max_size=x.shape[1] * k))
    g.add("matmul", x.ref, g.b.constant(np.array(w).reshape(x.shape[1], k)))
    v = data.draw(st.lists(st.floats(-2, 2), min_size=y.shape[0], max_size=y.shape[0]))
    g.add("mul", y.ref, g.b.constant(np.array(v, dtype=np.float32)))
    g.grow(OPS, 0, 5)
    return g.b.build([g.pool[-1].ref, data.draw(st.sampled_from(g.pool)).ref])


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cols=columns(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_a_boxed_report_bounds_every_neighbour_for_constants_in_the_box(
    cols: dict[str, Any], data: st.DataObject, seed: int
) -> None:
    """Random graphs with their float constants boxed: the report holds (sensitivity and
    bounds, on adversarial neighbours) for constants drawn anywhere in the boxes."""
    graph = _graph_with_constants(cols, data)
    constants = {
        i: n.value
        for i, n in enumerate(graph.nodes)
        if n.op == "constant" and n.value is not None and n.value.dtype.kind == "f"
    }
    if not constants:
        STATS["no constant"] += 1
        return
    rng = np.random.default_rng(seed)
    radius = data.draw(st.sampled_from([0.0, 1e-3, 0.1, 1.0]))
    boxes = {
        i: (v.astype(np.float64) - radius, v.astype(np.float64) + radius)
        for i, v in constants.items()
    }
    specs = {name: col.spec() for name, col in cols.items()}
    try:
        report = track(graph, specs, boxes=boxes)
    except PrivacyTrackingError:
        STATS["refused"] += 1
        return
    STATS["checked"] += 1
    for _ in range(3):
        moved = {i: np.asarray(rng.uniform(lo, hi)) for i, (lo, hi) in boxes.items()}
        assert_sound(_with_constants(graph, moved), report, *neighbours(cols, rng))


def test_the_boxed_attack_checks_graphs_with_constants() -> None:
    if sum(STATS.values()) < 100:  # ran alone: nothing to judge
        return
    assert STATS["checked"] >= 0.2 * sum(STATS.values()), STATS


@pytest.mark.parametrize("radius", [1e-3, 0.1, 0.5])
def test_a_convolution_with_a_boxed_weight_bounds_every_neighbour(radius: float) -> None:
    """A convolution's weight and bias as public boxes (a CNN's training step): the report
    holds for weights drawn anywhere in them, on neighbours at the corners."""
    rng = np.random.default_rng(11)
    shape = (5, 2, 6, 6)
    b = GraphBuilder()
    x = b.input("x", "float32", shape)
    w0 = rng.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32)
    bias0 = rng.uniform(-1, 1, 3).astype(np.float32)
    w, bias = b.constant(w0), b.constant(bias0)
    y = b.op("convolution", x, w, bias, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    relu = b.op("maximum", y, b.constant(np.float32(0.0)))
    graph = b.build([y, b.op("sum", relu, dims=(1, 2, 3))])
    specs = {"x": InputSpec.private(0.0, 1.0)}
    index = {i for i, node in enumerate(graph.nodes) if node.op == "constant"}
    boxes = {i: (graph.nodes[i].value - radius, graph.nodes[i].value + radius) for i in index}
    boxes = {i: (lo.astype(np.float64), hi.astype(np.float64)) for i, (lo, hi) in boxes.items()}
    report = track(graph, specs, boxes=boxes)
    exact = track(graph, specs)
    assert report.outputs[0].l1 >= exact.outputs[0].l1  # the box holds the exact weights too
    cols = {"x": Column("float32", shape, 0.0, 1.0)}
    for _ in range(20):
        moved = {i: np.asarray(rng.uniform(lo, hi)) for i, (lo, hi) in boxes.items()}
        assert_sound(_with_constants(graph, moved), report, *neighbours(cols, rng))


def test_an_identity_subject_index_is_keyed_by_its_length_alone() -> None:
    from dpnode.core.privacy import Subjects
    from dpnode.core.privacy.cache import _specs_key

    def key(subjects: Subjects) -> str:
        return _specs_key({"x": InputSpec.private(0.0, 1.0, subjects)})

    n = 1000
    assert Subjects.identity(n).is_identity
    assert key(Subjects.identity(n)) == key(Subjects.of(np.arange(n)))  # the same index
    assert key(Subjects.identity(n)) != key(Subjects.identity(n + 1))
    gap = np.concatenate([np.arange(n - 1), [n]])  # distinct and increasing, one id skipped
    assert not Subjects.of(gap).is_identity
    assert key(Subjects.identity(n)) != key(Subjects.of(gap))
    pairs = np.arange(n) // 2
    assert key(Subjects.of(pairs)) != key(Subjects.identity(n))


def test_the_same_publish_again_reuses_its_exact_report() -> None:
    cache = TrackingCache()
    w, mask = np.full(D, 0.5), np.ones((N, 1))
    first = cache.report(_planned(_dpsgd(w, mask)), SPECS)
    again = cache.report(_planned(_dpsgd(w.copy(), mask.copy())), SPECS)
    assert (cache.tracked, cache.hits) == (1, 1) and again is first
    # a constant with other bits (here -0.0 for 0.0) is not the same constant
    fresh = TrackingCache()
    zero = mask.copy()
    zero[0] = 0.0
    fresh.report(_planned(_dpsgd(w, zero)), SPECS)
    zero[0] = -0.0
    fresh.report(_planned(_dpsgd(w, zero)), SPECS)
    assert (fresh.tracked, fresh.hits) == (2, 0)


def test_a_reused_report_keeps_its_release_plan_for_the_same_parameters() -> None:
    """The training loop's steps inside a box share their report; the release plan worked out
    from it (noise, clip ranges, fallback) is kept with it per epsilon and delta, equal to
    one worked out afresh, and shared read-only."""
    from dpnode.core.privacy.release import plan_release

    cache = TrackingCache()
    rng = np.random.default_rng(1)
    w = rng.normal(size=D)
    plans = []
    for _ in range(6):
        plans.append(
            plan_release(_planned(_dpsgd(w)), SPECS, epsilon=1.0, delta=None, tracked=cache.report)
        )
        w = w + rng.uniform(-0.01, 0.01, D)
    shared = [p for p in plans[1:] if p.report is plans[-1].report]
    assert len(shared) >= 2 and all(p.lower is shared[0].lower for p in shared)
    p_report = shared[0].report
    # the same report as a new object, which keeps nothing: worked out again, the same
    fresh = plan_release(
        shared[0].plan, SPECS, epsilon=1.0, delta=None, tracked=lambda p, s: replace(p_report)
    )
    assert fresh.lower is not shared[0].lower
    public = ("mechanism", "count", "grid_exponent", "scale", "sensitivity", "epsilon", "rho")
    assert all(getattr(fresh.noise, f) == getattr(shared[0].noise, f) for f in public)
    for name in ("lower", "upper", "fallback"):
        kept = getattr(shared[0], name)
        assert np.array_equal(kept, getattr(fresh, name)) and not kept.flags.writeable
    other = plan_release(
        shared[0].plan, SPECS, epsilon=0.5, delta=None, tracked=lambda p, s: shared[0].report
    )
    assert other.noise.scale == 2 * shared[0].noise.scale
    gaussian = plan_release(
        shared[0].plan, SPECS, epsilon=1.0, delta=1e-6, tracked=lambda p, s: shared[0].report
    )
    assert gaussian.noise.mechanism == "gaussian" and len(shared[0].report.kept) == 3
