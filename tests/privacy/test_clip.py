"""DP-SGD: the rule of ``clip_by_subject_norm`` gives an L2 sensitivity of exactly 2C.

The engine does not have this prim yet; the fixture registers a reference kernel with
the contract of docs/sensitivity.md for the duration of each test, so the rule is
exercised through real graphs and real evaluations.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from node.engine import REGISTRY, GraphBuilder
from node.engine.prims import Call, TensorMeta
from node.engine.prims.registry import AttrSpec, prim
from node.privacy import InputSpec, PrivacyTrackingError, track
from tests.privacy.helpers import Column, assert_sound, neighbours

C = 0.75


def _infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    return TensorMeta(x.shape[1:], x.dtype)


def _kernel(c: Call, args: list[Any], out: Any) -> Any:
    x, groups = args
    bound = float(c.attr("max_norm"))
    uniq, inv = np.unique(groups, return_inverse=True)
    sums = np.zeros((len(uniq), *x.shape[1:]))
    np.add.at(sums, inv, x.astype(np.float64))
    norms = np.sqrt((sums.reshape(len(uniq), -1) ** 2).sum(axis=1))
    scale = np.minimum(1.0, bound / np.where(norms > 0, norms, 1.0))
    return (sums * scale.reshape((-1,) + (1,) * (x.ndim - 1))).sum(axis=0).astype(x.dtype)


@pytest.fixture
def clip_prim() -> Iterator[None]:
    prim("clip_by_subject_norm", args=2, attrs={"max_norm": AttrSpec("float")}, infer=_infer)(
        _kernel
    )
    try:
        yield
    finally:
        del REGISTRY["clip_by_subject_norm"]


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


@pytest.mark.usefixtures("clip_prim")
def test_one_row_per_subject_gives_exactly_2c(rng: np.random.Generator) -> None:
    n, d = 40, 5
    b, out = _grads(n, d, np.arange(n))
    graph = b.build([out])
    specs = {"X": InputSpec.private(-1.0, 1.0), "y": InputSpec.private(0.0, 1.0)}
    r = track(graph, specs)
    assert r.outputs[0].l2 == 2 * C
    assert r.outputs[0].l1 == pytest.approx(2 * C * math.sqrt(d))
    cols = {"X": Column("float64", (n, d), -1.0, 1.0), "y": Column("float64", (n,), 0.0, 1.0)}
    for _ in range(200):
        assert_sound(graph, r, *neighbours(cols, rng))


@pytest.mark.usefixtures("clip_prim")
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
    assert track(b.build([out]), specs).outputs[0].l2 == 2 * C
    b2, out2 = _grads(n, d, np.arange(n))  # clipping rows, not subjects: group privacy
    assert track(b2.build([out2]), specs).outputs[0].l2 == 3 * 2 * C
    cols = {
        "X": Column("float64", (n, d), -2.0, 2.0, subjects),
        "y": Column("float64", (n,), 0.0, 1.0, subjects),
    }
    r = track(b.build([out]), specs)
    for _ in range(200):
        assert_sound(b.build([out]), r, *neighbours(cols, rng))


@pytest.mark.usefixtures("clip_prim")
def test_clipping_refuses_rows_that_mix_subjects() -> None:
    b = GraphBuilder()
    x = b.input("X", "float64", (6, 2))
    mixed = b.op("sub", x, b.op("mean", x, dims=(0,), keepdim=True))  # every row sees all
    out = b.op("clip_by_subject_norm", mixed, b.constant(np.arange(6)), max_norm=1.0)
    with pytest.raises(PrivacyTrackingError, match="one subject only"):
        track(b.build([out]), {"X": InputSpec.private(0, 1)})
