"""Infinities that meet make NaN, and a NaN the tracker did not foresee is a leak.

A value the tracker bounds by ``[a, inf]`` may *be* infinite once computed (``exp(1000)``
overflows). Two such values of opposite signs added (``inf - inf``), a sum or product over
them, or ``0 * inf`` give NaN, and a squashing function after them (``tanh``, ``clamp``)
has finite bounds again, so the output looks tracked. The release then replaces the NaN by a
public stand-in: the answer jumps across the output's whole range when *one* row makes the
NaN, far beyond the sensitivity charged (an analyst learns whether any row's value exceeds a
threshold, at any epsilon). Each graph below must be refused, or give no NaN on datasets
chosen to make one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, Ref, plan, run
from dpnode.core.privacy import InputSpec, PrivacyTrackingError, track

N = 4
SIGNS = np.array([1.0, -1.0, 1.0, -1.0])

Build = Callable[[GraphBuilder, Ref, Ref], Ref]


def _exp(b: GraphBuilder, v: Ref) -> Ref:
    return b.op("exp", v)  # [1, inf]: exp(1000) overflows


GRAPHS: dict[str, Build] = {
    "sub": lambda b, x, y: b.op("sub", _exp(b, x), _exp(b, y)),
    "add of a negation": lambda b, x, y: b.op("add", _exp(b, x), b.op("neg", _exp(b, y))),
    "sum of signed terms": lambda b, x, y: b.op(
        "sum", b.op("mul", _exp(b, x), b.constant(SIGNS)), dims=[0], keepdim=True
    ),
    "mean of signed terms": lambda b, x, y: b.op(
        "mean", b.op("mul", _exp(b, x), b.constant(SIGNS)), dims=[0], keepdim=True
    ),
    "cumsum of signed terms": lambda b, x, y: b.op(
        "cumsum", b.op("mul", _exp(b, x), b.constant(SIGNS)), dim=0
    ),
    "matmul with signed weights": lambda b, x, y: b.op(
        "matmul", b.op("unsqueeze", _exp(b, x), dim=0), b.constant(SIGNS[:, None])
    ),
    "matmul of two private factors": lambda b, x, y: b.op(
        "matmul",
        b.op("unsqueeze", _exp(b, x), dim=0),
        b.op("unsqueeze", b.op("neg", _exp(b, y)), dim=1),
    ),
    "times zero": lambda b, x, y: b.op("mul", _exp(b, x), b.constant(np.zeros(N))),
    "ratio of infinities": lambda b, x, y: b.op("div", _exp(b, x), _exp(b, y)),
    "product over rows": lambda b, x, y: b.op(
        "prod", b.op("mul", _exp(b, x), b.op("exp", b.op("neg", y))), dims=[0], keepdim=True
    ),
}


@pytest.mark.parametrize("squash", ["tanh", "clamp"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_meeting_infinities_are_refused_or_never_nan(name: str, squash: str) -> None:
    b = GraphBuilder()
    x, y = b.input("x", "float64", (N,)), b.input("y", "float64", (N,))
    v = GRAPHS[name](b, x, y)
    v = b.op("tanh", v) if squash == "tanh" else b.op("clamp", v, -1.0, 1.0)
    graph = b.build([b.op("sum", v)])
    spec = InputSpec.private(0.0, 1000.0)
    try:
        report = track(graph, {"x": spec, "y": spec})
    except PrivacyTrackingError:
        return  # refused before any value is read: nothing to leak
    p = plan(graph, accurate=True)
    for values in (1000.0, 999.0, 0.0):
        data = {"x": np.full(N, 1000.0), "y": np.full(N, values)}
        with np.errstate(all="ignore"):
            out = float(run(p, data).outputs[0])
        assert not np.isnan(out), f"tracked (range {report.outputs[0].lower}) yet NaN"


def test_a_value_that_always_overflows_is_not_tracked_as_exact() -> None:
    # exp(800) is inf in float32 on every dataset: the error bound of its rounding is
    # inf - inf, which once counted as no error at all; atan(inf) then claimed the exact
    # pi/2, which float32 rounds above (a case found by the attack test)
    b = GraphBuilder()
    y = b.input("y", "float32", (2,))
    graph = b.build([b.op("atan", b.op("exp", b.op("mul", y, -800.0)))])
    try:
        report = track(graph, {"y": InputSpec.private(-1.0, -1.0)})
    except PrivacyTrackingError:
        return
    with np.errstate(all="ignore"):
        out = run(plan(graph, accurate=True), {"y": np.full(2, -1.0, np.float32)}).outputs[0]
    assert np.all(out.astype(np.float64) <= report.outputs[0].upper)
