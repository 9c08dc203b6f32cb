"""Refusals by attack: random graphs over neighbouring datasets must be refused alike.

The graphs of ``test_attack`` plus hostile ops an attacker would reach for: integer
division by a private divisor, private indices that may fall out of range, public-only
prims on private data, signbit, casts of floats to integers. Each graph goes through a
publish's two halves (``plan_release``, then ``run_release``) on pairs of neighbouring
datasets. What the analyst sees must be the same on both: the same refusal (type, code
and message), or an answer on both; and an answer never comes from the failure path
(total kernels: no value makes an evaluation fail), never holds NaN, and lies within its
public bounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import Graph, GraphBuilder, plan
from dpnode.core.errors import DPNodeError
from dpnode.core.privacy.release import plan_release, run_release
from tests.privacy.helpers import Column, neighbours
from tests.privacy.test_attack import OPS, Builder, columns

STATS = {"answered": 0, "refused": 0}


def op_divide(g: Builder) -> None:
    a, b = g.pick("fi"), g.pick("i")
    if a is not None and b is not None:
        name = g.draw(st.sampled_from(["floor_divide", "trunc_divide", "remainder", "fmod"]))
        g.add(name, a.ref, b.ref)


def op_private_index(g: Builder) -> None:
    i = g.pick("i", ndim_min=1)
    if i is None or len(i.shape) != 1:
        return
    table = g.b.constant(np.arange(float(g.draw(st.integers(1, 4)))))
    name = g.draw(st.sampled_from(["gather", "index_select", "index"]))
    if name == "index":
        g.add("index", table, i.ref)
    else:
        g.add(name, table, i.ref, dim=0)


def op_public_only(g: Builder) -> None:
    x = g.pick("f", ndim_min=1)
    if x is None:
        return
    name = g.draw(st.sampled_from(["cumsum", "argsort", "cholesky", "inv"]))
    if name in ("cumsum", "argsort"):
        g.add(name, x.ref, dim=0)
    elif len(x.shape) == 2 and x.shape[0] == x.shape[1]:
        g.add(name, x.ref)


def op_bits(g: Builder) -> None:
    x = g.pick("fi")
    if x is None:
        return
    if g.draw(st.booleans()):
        z = g.add("mul", x.ref, 0.0)
        if z is not None:
            g.add("signbit", z.ref)
    else:
        big = g.add("mul", x.ref, 1e300)
        if big is not None:
            g.add("convert_element_type", big.ref, dtype="int64")


HOSTILE = [op_divide, op_private_index, op_public_only, op_bits]


def hostile_graph(cols: dict[str, Column], data: st.DataObject) -> Graph:
    g = Builder(data)
    g.inputs(cols)
    g.grow(OPS + HOSTILE * 3, 1, 6)
    return g.b.build([g.pool[-1].ref])


def _seen(graph: Graph, cols: dict[str, Column], values: dict[str, Any]) -> tuple[str, ...]:
    """What the analyst sees of a publish of ``graph`` on ``values``, as a comparable tuple."""
    specs = {name: col.spec() for name, col in cols.items()}
    try:
        rp = plan_release(plan(graph, accurate=True), specs, epsilon=1.0, delta=None)
    except DPNodeError as exc:
        return (type(exc).__name__, exc.code, str(exc))
    done = run_release(rp, values)
    assert done.failure is None, done.failure  # the evaluation did not depend on luck
    flat = np.concatenate([v.ravel() for v in done.values])
    assert np.isfinite(flat).all()
    return ("answered",)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cols=columns(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_neighbours_are_refused_alike(
    cols: dict[str, Column], data: st.DataObject, seed: int
) -> None:
    graph = hostile_graph(cols, data)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        d1, d2 = neighbours(cols, rng)
        first, second = _seen(graph, cols, d1), _seen(graph, cols, d2)
        assert first == second
        STATS["answered" if first == ("answered",) else "refused"] += 1


def test_the_attack_reaches_both_outcomes() -> None:
    if sum(STATS.values()) < 100:  # ran alone: nothing to judge
        return
    # hypothesis explores in runs of similar graphs: the refused share of 900 pairs has
    # been seen from 8% to 19%, so the floor is a fraction of that
    assert STATS["answered"] >= 0.2 * sum(STATS.values()), STATS
    assert STATS["refused"] >= 0.04 * sum(STATS.values()), STATS


def test_sin_and_cos_of_a_product_that_overflows_are_refused() -> None:
    # Found by test_neighbours_are_refused_alike: an int64 column times 1e300 is float32
    # infinity (or NaN at 0), whose sine is NaN while the rule said [-1, 1]; the release then
    # came from the failure path (public stand-ins) instead of being refused. (It is now
    # refused sooner: an argument beyond +-512 would make the kernel's time show it.)
    cols = {"w": Column("int64", (2,), -500, 500, None)}
    for name in ("sin", "cos"):
        b = GraphBuilder()
        w = b.input("w", "int64", (2,))
        graph = b.build([b.op(name, b.op("mul", w, 1e300))])
        for values in ({"w": np.array([500, -500])}, {"w": np.array([0, 3])}):
            seen = _seen(graph, cols, values)
            assert seen[0] == "PrivacyTrackingError" and "time of the answer" in seen[2], seen
    b = GraphBuilder()  # a finite argument keeps its range [-1, 1]
    w = b.input("w", "int64", (2,))
    graph = b.build([b.op("sin", b.op("mul", w, 0.5))])
    assert _seen(graph, cols, {"w": np.array([500, -500])}) == ("answered",)


def test_a_scalar_that_overflows_the_compute_dtype_is_tracked_as_infinite() -> None:
    # Found by test_neighbours_are_refused_alike: zeros times 1e300, which is infinity in
    # the float32 the kernel computes in, are NaN there, while the rule took 0 * 1e300 = 0
    cols = {"u": Column("int64", (2,), 0, 3, None)}
    b = GraphBuilder()
    u = b.input("u", "int64", (2,))
    graph = b.build([b.op("exp", b.op("mul", b.op("mul", u, 0.0), 1e300))])
    seen = _seen(graph, cols, {"u": np.array([3, 2])})
    assert seen[0] == "PrivacyTrackingError" and "unbounded" in seen[2], seen
    b = GraphBuilder()  # in float64 the same scalar is finite: zeros stay zeros
    u = b.input("u", "int64", (2,))
    zero = b.op("mul", b.op("convert_element_type", u, dtype="float64"), 0.0)
    graph = b.build([b.op("exp", b.op("mul", zero, 1e300))])
    assert _seen(graph, cols, {"u": np.array([3, 2])}) == ("answered",)


def test_a_nan_is_not_laundered_into_a_bounded_value() -> None:
    """``exp`` of a wide float32 value overflows to inf on some data, its sum too, and
    ``inf / inf`` is NaN; ``1 / (|NaN| + 0.5)`` must not look bounded (an interval cannot hold
    a NaN: it once came out as [0, 2]). Also ``0 / 0`` and ``inf - inf``."""
    b = GraphBuilder()
    y = b.input("y", "float32", (2,))
    e = b.op("exp", b.op("mul", y, 40.0))
    ratio = b.op("div", e, b.op("sum", e, dims=(0,), keepdim=True))
    laundered = b.op("reciprocal", b.op("add", b.op("abs", ratio), 0.5))
    z = b.input("z", "float64", (2,))
    zero_by_zero = b.op("reciprocal", b.op("add", b.op("abs", b.op("div", z, z)), 0.5))
    graphs = [b.build([laundered]), b.build([zero_by_zero])]
    specs = {
        "y": Column("float32", (2,), 1.0, 3.0).spec(),
        "z": Column("float64", (2,), -1.0, 1.0).spec(),
    }
    for graph in graphs:
        with pytest.raises(DPNodeError, match="unbounded"):
            plan_release(plan(graph, accurate=True), specs, epsilon=1.0, delta=None)


def test_a_softmax_of_values_that_may_be_infinite_is_refused() -> None:
    """``x - amax(x) <= 0`` is the softmax relation's claim; with ``x`` possibly ``+inf``
    (exp of a wide float32 value overflows) ``inf - inf`` is NaN, so it must not be claimed."""
    b = GraphBuilder()
    y = b.input("y", "float32", (3,))
    x = b.op("exp", b.op("mul", y, 40.0))
    z = b.op("sub", x, b.op("amax", x, dims=(0,), keepdim=True))
    e = b.op("exp", z)
    softmax = b.op("div", e, b.op("sum", e, dims=(0,), keepdim=True))
    specs = {"y": Column("float32", (3,), 1.0, 3.0).spec()}
    with pytest.raises(DPNodeError, match="unbounded"):
        plan_release(plan(b.build([softmax]), accurate=True), specs, epsilon=1.0, delta=None)
    # finite logits keep the relation: the softmax of y itself is bounded in [0, 1]
    b2 = GraphBuilder()
    y2 = b2.input("y", "float32", (3,))
    z2 = b2.op("sub", y2, b2.op("amax", y2, dims=(0,), keepdim=True))
    e2 = b2.op("exp", z2)
    ok = b2.op("div", e2, b2.op("sum", e2, dims=(0,), keepdim=True))
    rp = plan_release(plan(b2.build([ok]), accurate=True), specs, epsilon=1.0, delta=None)
    assert rp.upper.max() <= 1.0 + 1e-4  # 1, plus float32 rounding
