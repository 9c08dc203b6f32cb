"""DP-SGD: the rule of ``clip_by_subject_norm`` gives an L2 sensitivity of exactly 2C.

The prim is the engine's own (``dpnode/core/engine/prims/dpsgd.py``): the rule is exercised
through real graphs and real evaluations, on neighbouring datasets at the bounds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, evaluate
from dpnode.core.privacy import InputSpec, PrivacyTrackingError, evaluate_tracked, track
from tests.privacy.helpers import Column, assert_sound, neighbours

C = 0.75


def _grads(n: int, d: int, groups: np.ndarray) -> tuple[GraphBuilder, Any]:
    """Per-example logistic-regression gradients (p - y) x, clipped per group and summed."""
    b = GraphBuilder()
    x = b.input("X", "float64", (n, d))
    y = b.input("y", "float64", (n,))
    w = b.constant(np.linspace(-1, 1, d).reshape(d, 1))
    z = b.op("squeeze", b.op("matmul", x, w), dims=(1,))
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    r = b.op("unsqueeze", b.op("sub", p, y), dim=1)
    g = b.op("mul", r, x)
    return b, b.op("clip_by_subject_norm", g, b.constant(groups), max_norm=C)


def test_one_row_per_subject_gives_exactly_2c(rng: np.random.Generator) -> None:
    n, d = 40, 5
    b, out = _grads(n, d, np.arange(n))
    graph = b.build([out])
    specs = {"X": InputSpec.private(-1.0, 1.0), "y": InputSpec.private(0.0, 1.0)}
    r = track(graph, specs)
    assert r.outputs[0].exact_l2 == 2 * C
    assert r.outputs[0].l2 == pytest.approx(2 * C, rel=1e-9)
    assert r.outputs[0].l1 == pytest.approx(2 * C * math.sqrt(d))
    cols = {"X": Column("float64", (n, d), -1.0, 1.0), "y": Column("float64", (n,), 0.0, 1.0)}
    for _ in range(200):
        assert_sound(graph, r, *neighbours(cols, rng))


def test_groups_equal_to_subjects_give_2c_and_rows_give_2c_per_row(
    rng: np.random.Generator,
) -> None:
    n, d = 30, 3
    subjects = np.repeat(np.arange(10), 3)
    specs = {
        "X": InputSpec.private(-2.0, 2.0, subjects),
        "y": InputSpec.private(0.0, 1.0, subjects),
    }
    b, out = _grads(n, d, subjects)
    assert track(b.build([out]), specs).outputs[0].exact_l2 == 2 * C
    b2, out2 = _grads(n, d, np.arange(n))  # clipping rows, not subjects: group privacy
    assert track(b2.build([out2]), specs).outputs[0].exact_l2 == 3 * 2 * C
    cols = {
        "X": Column("float64", (n, d), -2.0, 2.0, subjects),
        "y": Column("float64", (n,), 0.0, 1.0, subjects),
    }
    r = track(b.build([out]), specs)
    for _ in range(200):
        assert_sound(b.build([out]), r, *neighbours(cols, rng))


def test_clipping_refuses_rows_that_mix_subjects() -> None:
    b = GraphBuilder()
    x = b.input("X", "float64", (6, 2))
    mixed = b.op("sub", x, b.op("mean", x, dims=(0,), keepdim=True))  # every row sees all
    out = b.op("clip_by_subject_norm", mixed, b.constant(np.arange(6)), max_norm=1.0)
    with pytest.raises(PrivacyTrackingError, match="one subject only"):
        track(b.build([out]), {"X": InputSpec.private(0, 1)})


def _clip_rows(n: int, d: int, groups: Any, *, groups_input: bool = False) -> Any:
    """clip_by_subject_norm of a private [n, d] input itself (the rows are the gradients)."""
    b = GraphBuilder()
    x = b.input("X", "float64", (n, d))
    g = b.input("groups", "int64", (n,)) if groups_input else b.constant(groups)
    return b.build([b.op("clip_by_subject_norm", x, g, max_norm=C)])


def test_the_bound_is_reached_at_the_corners(rng: np.random.Generator) -> None:
    """Neighbours at opposite corners of the box move the output by exactly 2C (C < |row|)."""
    n, d = 12, 4
    graph = _clip_rows(n, d, np.arange(n))
    r = track(graph, {"X": InputSpec.private(-1.0, 1.0)})
    assert r.l2 == r.outputs[0].l2 == pytest.approx(2 * C, rel=1e-9)
    worst = 0.0
    for s in range(n):
        a = rng.uniform(-1, 1, (n, d))
        a[s], b = 1.0, a.copy()
        b[s] = -1.0
        moved = np.linalg.norm(evaluate(graph, {"X": a})[0] - evaluate(graph, {"X": b})[0])
        assert moved <= 2 * C * (1 + 1e-12)
        worst = max(worst, moved)
    assert worst == pytest.approx(2 * C, rel=1e-12)
    cols = {"X": Column("float64", (n, d), -1.0, 1.0)}
    for _ in range(300):
        assert_sound(graph, r, *neighbours(cols, rng))


def test_groups_from_a_public_subject_index_input_give_exactly_2c(
    rng: np.random.Generator,
) -> None:
    """The node binds ``dataset:<id>/@subject`` as a public input with its value: exact."""
    n, d = 24, 3
    subjects = np.repeat(np.arange(8), 3)
    rng.shuffle(subjects)
    graph = _clip_rows(n, d, None, groups_input=True)
    specs = {"X": InputSpec.private(-1.0, 1.0, subjects), "groups": InputSpec.public(subjects)}
    assert track(graph, specs).l2 == pytest.approx(2 * C, rel=1e-9)
    x = rng.uniform(-1, 1, (n, d))
    _, report = evaluate_tracked(graph, {"X": x, "groups": subjects}, specs)
    assert report.l2 == pytest.approx(2 * C, rel=1e-9)
    # a public input whose value the tracker does not know: every row may be its own group
    unknown = {"X": specs["X"], "groups": InputSpec.public()}
    assert track(graph, unknown).l2 == pytest.approx(3 * 2 * C, rel=1e-9)
    cols = {"X": Column("float64", (n, d), -1.0, 1.0, subjects)}
    r = track(graph, specs)
    for _ in range(300):
        d1, d2 = neighbours(cols, rng)
        assert_sound(graph, r, d1, d2, public={"groups": subjects})


def test_private_groups_are_refused() -> None:
    graph = _clip_rows(6, 2, None, groups_input=True)
    specs = {"X": InputSpec.private(-1.0, 1.0), "groups": InputSpec.private(0, 5)}
    with pytest.raises(PrivacyTrackingError, match="grouping of rows must be public"):
        track(graph, specs)


def test_several_parameters_clipped_jointly_stay_at_2c(rng: np.random.Generator) -> None:
    """A weight's and a bias's per-example gradients, concatenated, clipped as one vector."""
    n, d = 30, 4
    b = GraphBuilder()
    x = b.input("X", "float64", (n, d))
    y = b.input("y", "float64", (n,))
    w = b.constant(np.linspace(-1, 1, d).reshape(d, 1))
    z = b.op("squeeze", b.op("matmul", x, w), dims=(1,))
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    r = b.op("unsqueeze", b.op("sub", p, y), dim=1)
    gw = b.op("mul", r, x)  # [n, d]
    flat = b.op("cat", gw, r, dim=1)  # [n, d + 1]: weight and bias of one example
    out = b.op("clip_by_subject_norm", flat, b.constant(np.arange(n)), max_norm=C)
    graph = b.build([out])
    specs = {"X": InputSpec.private(-1.0, 1.0), "y": InputSpec.private(0.0, 1.0)}
    report = track(graph, specs)
    assert report.l2 == pytest.approx(2 * C, rel=1e-9)
    assert report.l1 == pytest.approx(2 * C * math.sqrt(d + 1))
    cols = {"X": Column("float64", (n, d), -1.0, 1.0), "y": Column("float64", (n,), 0.0, 1.0)}
    for _ in range(200):
        assert_sound(graph, report, *neighbours(cols, rng))


@pytest.mark.parametrize("subjects", [None, np.repeat(np.arange(10), 3)])
def test_clipping_in_l1_gives_2c_in_l1(rng: np.random.Generator, subjects: Any) -> None:
    """``ord=1``: each group's sum is clipped to L1 norm C, and the output moves by 2C in L1
    (a Laplace release's sensitivity), checked on neighbours at the corners."""
    n, d = 30, 4
    groups = np.arange(n) if subjects is None else subjects
    b = GraphBuilder()
    x = b.input("X", "float64", (n, d))
    graph = b.build([b.op("clip_by_subject_norm", x, b.constant(groups), max_norm=C, ord=1)])
    specs = {"X": InputSpec.private(-1.0, 1.0, subjects)}
    r = track(graph, specs)
    assert r.outputs[0].exact_l2 == 2 * C and r.outputs[0].l1 == pytest.approx(2 * C, rel=1e-9)
    cols = {"X": Column("float64", (n, d), -1.0, 1.0, subjects)}
    for _ in range(200):
        assert_sound(graph, r, *neighbours(cols, rng))
    values = rng.uniform(-1, 1, (n, d))
    (got,) = evaluate(graph, {"X": values})
    sums = np.stack([values[groups == g].sum(0) for g in np.unique(groups)])
    l1 = np.abs(sums).sum(1, keepdims=True)
    want = (sums * np.minimum(1.0, C / l1)).sum(0)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("subjects", [None, np.repeat(np.arange(10), 3)])
def test_several_parts_are_clipped_as_one_vector_per_row(
    rng: np.random.Generator, subjects: Any
) -> None:
    """``clip_by_subject_norm(w, b, groups)`` joins each row of ``w`` and ``b`` (a weight's
    and a bias's per-example gradients) into one vector, as ``cat`` would, without the copy:
    the same values as clipping the concatenation, and the same 2C on neighbours."""
    n = 30
    groups = np.arange(n) if subjects is None else subjects
    b = GraphBuilder()
    w = b.input("w", "float32", (n, 3, 2))
    bias = b.input("bias", "float32", (n, 4))
    joined = b.op("clip_by_subject_norm", w, bias, b.constant(groups), max_norm=C)
    flat = b.op("cat", b.op("reshape", w, shape=(n, 6)), bias, dim=1)
    single = b.op("clip_by_subject_norm", flat, b.constant(groups), max_norm=C)
    specs = {
        "w": InputSpec.private(-1.0, 1.0, subjects),
        "bias": InputSpec.private(-2.0, 2.0, subjects),
    }
    graph = b.build([joined])
    r = track(graph, specs)
    assert r.outputs[0].shape == (10,) and r.outputs[0].exact_l2 == 2 * C
    values = {"w": rng.uniform(-1, 1, (n, 3, 2)), "bias": rng.uniform(-2, 2, (n, 4))}
    values = {k: v.astype(np.float32) for k, v in values.items()}
    got, want = evaluate(b.build([joined, single]), values)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    cols = {
        "w": Column("float32", (n, 3, 2), -1.0, 1.0, subjects),
        "bias": Column("float32", (n, 4), -2.0, 2.0, subjects),
    }
    for _ in range(100):
        assert_sound(graph, r, *neighbours(cols, rng))


@pytest.mark.parametrize("first", [True, False])
def test_a_part_with_no_values_in_its_rows_adds_nothing(
    rng: np.random.Generator, first: bool
) -> None:
    # an (n, 0) part (a slice or a pad down to no columns) raised IndexError in the rule,
    # where the owner of each row was read from its first value
    n = 12
    b = GraphBuilder()
    x = b.input("x", "float64", (n, 3))
    empty = b.op("slice", x, dim=1, start=0, end=0, step=1)
    parts = (empty, x) if first else (x, empty)
    graph = b.build([b.op("clip_by_subject_norm", *parts, b.constant(np.arange(n)), max_norm=C)])
    r = track(graph, {"x": InputSpec.private(-1.0, 1.0)})
    assert r.outputs[0].shape == (3,) and r.outputs[0].exact_l2 == 2 * C
    cols = {"x": Column("float64", (n, 3), -1.0, 1.0, None)}
    for _ in range(50):
        assert_sound(graph, r, *neighbours(cols, rng))


def test_parts_of_different_subjects_row_by_row_are_refused() -> None:
    b = GraphBuilder()
    w = b.input("w", "float64", (6, 2))
    other = b.input("other", "float64", (6, 2))
    flipped = b.op("flip", other, dims=(0,))  # row i holds subject 5 - i's values
    out = b.op("clip_by_subject_norm", w, flipped, b.constant(np.arange(6)), max_norm=1.0)
    specs = {"w": InputSpec.private(0.0, 1.0), "other": InputSpec.private(0.0, 1.0)}
    with pytest.raises(PrivacyTrackingError, match="same subjects"):
        track(b.build([out]), specs)


def _outer_graph(n: int, groups: Any, *, order: int = 2, public_x: Any = None) -> Any:
    """A linear layer's per-example gradients as the SDK sends them: the weight's as the
    factors ``g [n, 3]`` (the output's gradient) and ``x [n, 4]`` (the input), ``outer``,
    and the bias's ``g`` whole; next to it the same rows built and clipped, for comparison."""
    b = GraphBuilder()
    g = b.input("g", "float32", (n, 3))
    x = b.input("x", "float32", (n, 4)) if public_x is None else b.constant(public_x)
    s = b.constant(groups)
    kw: dict[str, Any] = {"max_norm": C} | ({"ord": 1} if order == 1 else {})
    factored = b.op("clip_by_subject_norm", g, x, g, s, outer=[1, 0], **kw)
    built = b.op(
        "reshape",
        b.op("mul", b.op("unsqueeze", g, dim=2), b.op("unsqueeze", x, dim=1)),
        shape=(n, 12),
    )
    return b, factored, b.op("clip_by_subject_norm", built, g, s, **kw)


@pytest.mark.parametrize("subjects", [None, np.repeat(np.arange(10), 3)])
@pytest.mark.parametrize("order", [2, 1])
def test_an_outer_part_gives_2c_like_the_rows_it_stands_for(
    rng: np.random.Generator, subjects: Any, order: int
) -> None:
    """The factored form of a linear layer's per-example gradients (never built on the
    node) is tracked as the rows it stands for: 2C, on neighbours at the corners too."""
    n = 30
    groups = np.arange(n) if subjects is None else subjects
    b, factored, built = _outer_graph(n, groups, order=order)
    specs = {
        "g": InputSpec.private(-1.0, 1.0, subjects),
        "x": InputSpec.private(-2.0, 2.0, subjects),
    }
    graph = b.build([factored])
    r = track(graph, specs)
    out = r.outputs[0]
    assert out.shape == (15,) and out.exact_l2 == 2 * C
    if order == 1:
        assert out.l1 == pytest.approx(2 * C, rel=1e-4)
    else:
        assert out.l2 == pytest.approx(2 * C, rel=1e-4)
        assert out.l2 == pytest.approx(track(b.build([built]), specs).outputs[0].l2, rel=1e-6)
    values = {"g": rng.uniform(-1, 1, (n, 3)), "x": rng.uniform(-2, 2, (n, 4))}
    values = {k: v.astype(np.float32) for k, v in values.items()}
    got, want = evaluate(b.build([factored, built]), values)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    cols = {
        "g": Column("float32", (n, 3), -1.0, 1.0, subjects),
        "x": Column("float32", (n, 4), -2.0, 2.0, subjects),
    }
    for _ in range(100):
        assert_sound(graph, r, *neighbours(cols, rng))
    worst = 0.0  # a row at opposite corners: the output moves by 2C, no more
    for s in range(5):
        a = {k: v.copy() for k, v in values.items()}
        a["g"][s], a["x"][s] = 1.0, 2.0
        z = {k: v.copy() for k, v in a.items()}
        z["g"][s] = -1.0
        moved = evaluate(graph, a)[0].astype(np.float64) - evaluate(graph, z)[0]
        worst = max(worst, float(np.abs(moved).sum() if order == 1 else np.linalg.norm(moved)))
    assert worst <= out.l1 if order == 1 else worst <= out.l2
    if subjects is None:
        assert worst == pytest.approx(2 * C, rel=1e-5)


def test_an_outer_part_with_a_public_factor_is_owned_by_the_other(
    rng: np.random.Generator,
) -> None:
    n = 12
    x = rng.uniform(-1, 1, (n, 4)).astype(np.float32)
    b, factored, _ = _outer_graph(n, np.arange(n), public_x=x)
    graph = b.build([factored])
    r = track(graph, {"g": InputSpec.private(-1.0, 1.0)})
    assert r.outputs[0].exact_l2 == 2 * C
    cols = {"g": Column("float32", (n, 3), -1.0, 1.0)}
    for _ in range(100):
        assert_sound(graph, r, *neighbours(cols, rng))


def test_outer_factors_of_different_subjects_row_by_row_are_refused() -> None:
    b = GraphBuilder()
    g = b.input("g", "float64", (6, 2))
    x = b.op("flip", b.input("x", "float64", (6, 3)), dims=(0,))  # row i: subject 5 - i
    out = b.op("clip_by_subject_norm", g, x, b.constant(np.arange(6)), max_norm=1.0, outer=[1])
    specs = {"g": InputSpec.private(0.0, 1.0), "x": InputSpec.private(0.0, 1.0)}
    with pytest.raises(PrivacyTrackingError, match="same subjects"):
        track(b.build([out]), specs)
    mixed = b.op("sub", g, b.op("mean", g, dims=(0,), keepdim=True))  # every row sees all
    out = b.op("clip_by_subject_norm", mixed, g, b.constant(np.arange(6)), max_norm=1.0, outer=[1])
    with pytest.raises(PrivacyTrackingError, match="one subject only"):
        track(b.build([out]), specs)


@pytest.mark.parametrize("outer", [False, True])
def test_rows_that_overflow_are_clipped_and_stay_at_2c(outer: bool) -> None:
    """Rows whose values may overflow (bounds up to inf) are clipped all the same: the kernel
    zeroes a row's infinite or NaN values (and computes a float64 row's norm scaled, so that
    it does not overflow), so a row's clipped vector is a function of that row alone of norm
    at most C whatever it holds.
    A row that could be NaN is refused: which subjects a NaN depends on is not known."""
    n, d = 6, 3
    b = GraphBuilder()
    x = b.input("X", "float64", (n, d))
    # [1, inf]: e^690 e^110 overflows (exp itself stays where its time is flat)
    big = b.op("mul", b.op("exp", b.op("mul", x, 690.0)), b.op("exp", b.op("mul", x, 110.0)))
    if outer:
        parts = [b.op("neg", big), x]
        out = b.op("clip_by_subject_norm", *parts, b.constant(np.arange(n)), max_norm=C, outer=[1])
    else:
        out = b.op("clip_by_subject_norm", b.op("neg", big), b.constant(np.arange(n)), max_norm=C)
    graph = b.build([out])
    specs = {"X": InputSpec.private(0.0, 1.0)}
    report = track(graph, specs)
    assert report.outputs[0].exact_l2 == 2 * C
    calm = np.full((n, d), 0.5)
    wild = calm.copy()
    wild[2] = [1.0, 0.2, 0.3]  # exp(800) = inf in one element of row 2
    with np.errstate(over="ignore"):
        (a,), (w,) = evaluate(graph, {"X": calm}), evaluate(graph, {"X": wild})
    assert np.isfinite(w).all()
    assert float(np.linalg.norm(a - w)) <= 2 * C * (1 + 1e-12)

    nan = GraphBuilder()
    x = nan.input("X", "float64", (n, d))
    e = nan.op(
        "mul", nan.op("exp", nan.op("mul", x, 690.0)), nan.op("exp", nan.op("mul", x, 110.0))
    )
    rows = nan.op("sub", e, e)  # inf - inf
    nan_graph = nan.build(
        [nan.op("clip_by_subject_norm", rows, nan.constant(np.arange(n)), max_norm=C)]
    )
    with pytest.raises(PrivacyTrackingError, match="may be NaN"):
        track(nan_graph, specs)


@pytest.mark.parametrize(("tiny", "huge"), [(1e-170, 1e170), (1e-155, 1e154), (1e-300, 1e299)])
def test_a_tiny_public_factor_times_a_huge_private_one_is_clipped(
    rng: np.random.Generator, tiny: float, huge: float
) -> None:
    # a linear layer's gradient g (x) x with a public g of 1e-170 on row 0 and the private
    # x scaled by 1e170: |g|^2 underflowed, |x|^2 overflowed (or flushed and stayed finite),
    # the row's norm came out NaN or 0 and the row was not clipped: a publish at epsilon 1
    # showed row 0's value to within 0.05 (the noise was for 2C = 0.02)
    n, bound = 20, 0.01
    b = GraphBuilder()
    x = b.input("X", "float64", (n, 1))
    g = np.zeros((n, 1))
    g[0, 0] = tiny
    scaled = b.op("mul", x, huge)
    out = b.op(
        "clip_by_subject_norm",
        b.constant(g),
        scaled,
        b.constant(np.arange(n)),
        max_norm=bound,
        outer=[1],
    )
    graph = b.build([out])
    report = track(graph, {"X": InputSpec.private(0.0, 1.0)})
    assert report.outputs[0].l2 == pytest.approx(2 * bound, rel=1e-9)
    for secret in (0.0, 0.3, 1.0):
        d1 = {"X": rng.uniform(0, 1, (n, 1))}
        d2 = {"X": d1["X"].copy()}
        d1["X"][0, 0], d2["X"][0, 0] = secret, 1.0 - secret
        assert_sound(graph, report, d1, d2)


def test_a_zero_factor_times_a_huge_one_does_not_leave_the_other_parts_unclipped() -> None:
    # a linear layer whose output gradient is 0 for a row (a dead ReLU, or * 0) and whose
    # input is huge (a public weight of 1e300): its factor exponents added up to about 997,
    # the row's other parts' squares underflowed next to it, and the row went unclipped
    n = 4
    b = GraphBuilder()
    x = b.input("X", "float64", (n, 3))
    zero = b.op("mul", x, 0.0)
    huge = b.op("add", b.op("mul", x, 1e300), 1e300)
    other = b.op("mul", x, 100.0)  # another parameter's rows: norm up to 173 >> C
    out = b.op(
        "clip_by_subject_norm",
        zero,
        huge,
        other,
        b.constant(np.arange(n)),
        max_norm=1.0,
        outer=[1, 0],
    )
    graph = b.build([out])
    report = track(graph, {"X": InputSpec.private(-1.0, 1.0)})
    d1 = {"X": np.full((n, 3), 0.5)}
    d2 = {"X": d1["X"].copy()}
    d1["X"][0], d2["X"][0] = 1.0, -1.0
    assert_sound(graph, report, d1, d2)


@pytest.mark.parametrize("order", [1, 2])
def test_rows_numbered_by_the_node_are_tracked_and_run_as_a_constant_of_row_indices(
    rng: np.random.Generator, order: int
) -> None:
    """The SDK numbers the rows to clip one by one with the node's ``arange`` instead of a
    constant of the row indices: the same report (so the same noise) and the same values
    to the bit, and sound on adversarial neighbours."""
    n, d = 300, 4
    graphs = []
    for numbered in (False, True):
        b = GraphBuilder()
        x = b.input("X", "float64", (n, d))
        rows = (
            b.op("arange", start=0.0, end=float(n), step=1.0, dtype="int64")
            if numbered
            else b.constant(np.arange(n))
        )
        graphs.append(b.build([b.op("clip_by_subject_norm", x, rows, max_norm=C, ord=order)]))
    specs = {"X": InputSpec.private(-3.0, 3.0)}
    reports = [track(g, specs) for g in graphs]
    (before,), (after,) = (r.outputs for r in reports)
    for field in dataclasses.fields(before):  # every bound, sensitivity and rounding term
        assert np.array_equal(getattr(before, field.name), getattr(after, field.name))
    assert reports[0].l1 == reports[1].l1 and reports[0].l2 == reports[1].l2
    assert reports[1].outputs[0].exact_l1 == 2 * C * (1 if order == 1 else math.sqrt(d))
    cols = {"X": Column("float64", (n, d), -3.0, 3.0)}
    for _ in range(50):
        d1, d2 = neighbours(cols, rng)
        values = [evaluate(g, d1)[0] for g in graphs]
        assert values[0].tobytes() == values[1].tobytes()
        assert_sound(graphs[1], reports[1], d1, d2)
