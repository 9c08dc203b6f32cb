"""Refusals, independence from the data, the public API, and the registry of rules."""

from __future__ import annotations

import numpy as np
import pytest

from dpnode.core.engine import REGISTRY, GraphBuilder, Ref, evaluate
from dpnode.core.engine.dtypes import dtype
from dpnode.core.engine.graph import Node
from dpnode.core.engine.prims import Call, TensorMeta
from dpnode.core.privacy import (
    RULES,
    InputSpec,
    PrivacyTracker,
    PrivacyTrackingError,
    evaluate_tracked,
    track,
)
from dpnode.core.privacy.spec import InputSpec as Spec
from tests.privacy.helpers import Column, assert_sound, neighbours


def test_every_rule_is_keyed_by_a_prim_name() -> None:
    assert set(RULES) - set(REGISTRY) == set()


@pytest.mark.parametrize(
    "name", sorted(n for n, d in REGISTRY.items() if d.privacy == "public_only")
)
def test_a_prim_without_a_rule_is_refused_on_private_data(name: str) -> None:
    tracker = PrivacyTracker({"x": Spec.private(0.0, 1.0)})
    meta = TensorMeta((3,), dtype("float32"))
    x = tracker.visit(
        0, Node("input", (), {"name": "x", "dtype": "float32", "shape": (3,)}), None, meta, []
    )
    call = Call(1, name, [meta], {})
    call.meta = meta
    with pytest.raises(PrivacyTrackingError, match=f"prim '{name}' has no privacy rule"):
        tracker.visit(1, Node(name, (Ref(0),)), call, meta, [x])


def test_an_unruled_prim_in_a_graph_names_the_prim() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (5,))
    with pytest.raises(PrivacyTrackingError, match="'cumsum'"):
        track(b.build([b.op("cumsum", x, dim=0)]), {"x": InputSpec.private(0, 1)})


@pytest.mark.parametrize(
    ("lower", "upper"), [(np.nan, 1.0), (0.0, np.inf), (-np.inf, 0.0), ([0, np.nan], 1.0)]
)
def test_nan_or_infinite_bounds_are_refused(lower: object, upper: object) -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (4, 2))
    with pytest.raises(PrivacyTrackingError, match="finite"):
        track(b.build([b.op("sum", x)]), {"x": InputSpec.private(lower, upper)})


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (InputSpec.private(2.0, 1.0), "exceeds"),
        (InputSpec.private([0, 0, 0], 1.0), "do not fit"),
        (InputSpec.private(0, 1, np.array([0, 1, 2])), "one per row"),
        (InputSpec.private(0, 1, np.array([0, -1, 2, 3])), "non-negative"),
        (InputSpec(), "need lower and upper"),
    ],
)
def test_bad_metadata_is_refused(spec: InputSpec, match: str) -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (4, 2))
    with pytest.raises(PrivacyTrackingError, match=match):
        track(b.build([b.op("sum", x)]), {"x": spec})


def test_an_input_without_metadata_is_refused() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (4,))
    with pytest.raises(PrivacyTrackingError, match="no privacy metadata"):
        track(b.build([b.op("sum", x)]), {})


@pytest.mark.parametrize(
    ("build", "lo", "hi", "dt"),
    [
        (lambda b, x: b.op("log", x), 0.0, 1.0, "float32"),  # log(0) = -inf
        (lambda b, x: b.op("div", 1.0, x), -1.0, 1.0, "float64"),  # 1 / [-1, 1]
        (lambda b, x: b.op("div", x, b.op("sub", x, 0.5)), 0.0, 1.0, "float64"),
        (lambda b, x: b.op("exp", x), 0.0, 1000.0, "float32"),  # overflows float32
        (lambda b, x: b.op("sqrt", x), -1.0, 1.0, "float64"),  # NaN below 0
    ],
)
def test_unbounded_outputs_are_refused(build: object, lo: float, hi: float, dt: str) -> None:
    b = GraphBuilder()
    x = b.input("x", dt, (4,))
    out = b.op("sum", build(b, x))  # type: ignore[operator]
    with pytest.raises(PrivacyTrackingError, match="unbounded"):
        track(b.build([out]), {"x": InputSpec.private(lo, hi)})


def test_a_private_index_is_refused() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (4, 3))
    arg = b.op("argmax", x, dim=1, keepdim=True)
    with pytest.raises(PrivacyTrackingError, match="index must be public"):
        track(b.build([b.op("gather", x, arg, dim=1)]), {"x": InputSpec.private(0, 1)})


def test_integer_wraparound_is_not_trusted(rng: np.random.Generator) -> None:
    b = GraphBuilder()
    x = b.input("x", "int32", (4,))
    big = b.op("mul", x, 2**30)  # wraps in int32
    graph = b.build([b.op("sum", big, dtype="int64")])
    # a wide domain: no table, so the wrapped product may be anything in int32's range
    r = track(graph, {"x": InputSpec.private(0, 1000)})
    assert r.outputs[0].exact_l1 == 2.0**32 - 1
    # a small domain is tabulated with the kernel itself: the wrapped values are exact
    r = track(graph, {"x": InputSpec.private(0, 7)})
    assert r.outputs[0].exact_l1 == 3 * 2.0**30  # from -2**31 (x = 6) to 2**30 (x = 1 or 5)
    cols = {"x": Column("int32", (4,), 0, 7)}
    for _ in range(100):
        assert_sound(graph, r, *neighbours(cols, rng))


def test_any_of_numbers_is_a_jump(rng: np.random.Generator) -> None:
    # found by the attack: any(x) tests x != 0, so a tiny change can flip it
    b = GraphBuilder()
    x = b.input("x", "float64", (2, 1))
    sq = b.op("mul", x, x)
    graph = b.build([b.op("any", sq)])
    r = track(graph, {"x": InputSpec.private(0.0, 0.5)})
    assert r.outputs[0].exact_l1 == 1.0
    cols = {"x": Column("float64", (2, 1), 0.0, 0.5)}
    for _ in range(50):
        assert_sound(graph, r, *neighbours(cols, rng))


def test_public_graphs_have_zero_sensitivity() -> None:
    b = GraphBuilder()
    w = b.input("w", "float32", (3,))
    c = b.constant(np.arange(3.0, dtype=np.float32))
    r = track(b.build([b.op("sum", b.op("mul", w, c))]), {"w": InputSpec.public()})
    assert (r.outputs[0].l1, r.outputs[0].l2) == (0.0, 0.0)


def _graphs() -> list[tuple[GraphBuilder, list[Ref]]]:
    out = []
    b = GraphBuilder()
    x = b.input("x", "float32", (50, 3))
    u = b.input("u", "int64", (50,))
    w = b.input("w", "float32", (3, 2))
    z = b.op("matmul", x, w)
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    hist = b.op("sum", b.op("eq", b.op("unsqueeze", u, dim=1), b.constant(np.arange(5))), dims=(0,))
    cx = b.op("sub", x, b.op("mean", x, dims=(0,), keepdim=True))
    var = b.op("mean", b.op("mul", cx, cx), dims=(0,))
    out.append((b, [b.op("mean", p, dims=(0,)), hist, var, b.op("amax", x)]))
    return out


def test_sensitivity_does_not_depend_on_the_data(rng: np.random.Generator) -> None:
    specs = {
        "x": InputSpec.private(-1.0, [1.0, 2.0, 3.0], np.repeat(np.arange(25), 2)),
        "u": InputSpec.private(0, 4, np.repeat(np.arange(25), 2)),
        "w": InputSpec.public(),
    }
    for b, outs in _graphs():
        graph = b.build(outs)
        w = rng.normal(size=(3, 2)).astype(np.float32)
        free = track(graph, {**specs, "w": InputSpec.public(w)})
        reports = []
        for _ in range(3):
            data: dict[str, np.ndarray] = {
                "x": rng.uniform(-1, 1, (50, 3)).astype(np.float32),
                "u": rng.integers(0, 5, 50),
                "w": w,
            }
            reports.append(evaluate_tracked(graph, data, specs)[1])
        for r in [free, *reports[1:]]:
            for o, ref in zip(r.outputs, reports[0].outputs, strict=True):
                assert (o.l1, o.l2) == (ref.l1, ref.l2)
                np.testing.assert_array_equal(o.lower, ref.lower)
                np.testing.assert_array_equal(o.upper, ref.upper)
                np.testing.assert_array_equal(o.per_subject_l1, ref.per_subject_l1)


def test_the_tracker_is_never_handed_a_value() -> None:
    # the protocol gives the tracker the node, its call (metadata) and argument states only
    import inspect

    params = list(inspect.signature(PrivacyTracker.visit).parameters)
    assert params == ["self", "index", "node", "call", "meta", "arg_states"]


def test_joint_report_of_several_outputs() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (10,))
    r = track(b.build([b.op("sum", x), b.op("mean", x)]), {"x": InputSpec.private(0, 1)})
    assert r.l1 == pytest.approx(1.1) and r.l2 == pytest.approx(np.hypot(1.0, 0.1))
    assert r.subjects == 10


def test_every_prim_declares_whether_it_may_touch_private_data() -> None:
    # the declaration lives in the engine (which cannot import the privacy layer); it must
    # agree with the rules exactly, both ways, and no prim may leave it out
    declared = {name: d.privacy for name, d in REGISTRY.items()}
    assert set(declared.values()) <= {"rule", "public_only"}
    with_rule = {name for name, kind in declared.items() if kind == "rule"}
    missing_rule = sorted(with_rule - set(RULES))
    assert not missing_rule, f"declared privacy='rule' but have no rule: {missing_rule}"
    undeclared = sorted(set(RULES) - with_rule)
    assert not undeclared, f"have a privacy rule but are declared public_only: {undeclared}"


def test_a_registration_without_a_privacy_declaration_is_refused() -> None:
    from dpnode.core.engine.prims.registry import prim

    def infer(c: Call) -> TensorMeta:
        return c.tensor(0)

    with pytest.raises(TypeError, match="privacy"):
        prim("not_a_prim", args=1, infer=infer)  # type: ignore[call-arg]
    with pytest.raises(AssertionError, match="privacy must be one of"):
        prim("not_a_prim", args=1, infer=infer, privacy="maybe")  # type: ignore[arg-type]
    assert "not_a_prim" not in REGISTRY


@pytest.mark.parametrize("op", ["asinh", "atan", "tanh", "erf", "erfc", "sinh", "abs", "neg"])
@pytest.mark.parametrize(
    ("lo", "hi"),
    [(1e155, 1e251), (-1e300, 1e300), (1e-300, 1e-200), (-1e-160, 1e-170), (1.0, 1e308)],
)
def test_a_monotone_function_far_from_zero_is_bounded_by_its_slope(
    op: str, lo: float, hi: float
) -> None:
    # asinh's slope 1 / sqrt(1 + x^2) squared x: above 1.3e154 it overflowed, the slope was
    # 0, and a sum of asinh over rows in [1e155, 1e251] was tracked at 2e-11 for a change of
    # 220 (a Laplace release showed a row's value); each rule is checked at the corners
    n = 5
    b = GraphBuilder()
    x = b.input("x", "float64", (n,))
    graph = b.build([b.op("sum", b.op(op, x))])
    with np.errstate(all="ignore"):
        try:
            report = track(graph, {"x": Spec.private(lo, hi)})
        except PrivacyTrackingError:  # (sinh overflows: refused)
            return
        base = np.full(n, lo)
        for a, c in ((lo, hi), (hi, lo), ((lo + hi) / 2, hi), (lo, lo / 2 + hi / 2)):
            d1, d2 = base.copy(), base.copy()
            d1[0], d2[0] = a, c
            assert_sound(graph, report, {"x": d1}, {"x": d2})


@pytest.mark.parametrize(("op", "value"), [("any", False), ("all", True)])
def test_any_and_all_over_empty_rows_are_public(op: str, value: bool) -> None:
    # a column whose rows hold no value (row shape [0], which uploads accept): aggregating
    # the owners of no elements raised ValueError (a 500 from /sensitivity and /publish)
    b = GraphBuilder()
    x = b.input("x", "float64", (5, 0))
    graph = b.build([b.op(op, x, dims=(1,))])
    (out,) = track(graph, {"x": InputSpec.private(0.0, 1.0)}).outputs
    assert out.l1 == 0.0
    (got,) = evaluate(graph, {"x": np.zeros((5, 0))})
    assert got.tolist() == [value] * 5
