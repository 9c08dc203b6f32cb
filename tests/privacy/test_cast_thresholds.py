"""Comparisons of a cast column with thresholds: the table cuts the root where the cast
crosses each threshold, rounding and all.

``x.float() >= b`` for a float64 ``x`` is true from half a float32 step below ``b`` (or at
it, ties going to even); an integer beyond 2^24 rounds to a neighbour; a float64 beyond
float16's range overflows to infinity; a float32 subnormal flushes to zero in the
engine. Each case compares the cast with thresholds at and beside such values, in a
function that is *not* a partition (indicators of overlapping ranges, weighted), so that
the table's bound depends on every piece being cut right. The bound must hold for every
pair of values a row can take around the thresholds (one row: its output is the function
itself), and equal the worst of them: a piece cut in the wrong place would show as a
change above the bound, or as a bound no pair of values reaches.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, plan, run
from dpnode.core.privacy import InputSpec, track

F32 = np.float32


def _near(v: float, dt: np.dtype[Any], steps: int = 3) -> list[float]:
    """``v`` in ``dt`` and its ``steps`` neighbours either side."""
    if dt.kind in "iu":
        return [float(math.floor(v) + k) for k in range(-steps, steps + 2)]
    out = []
    for direction in (-np.inf, np.inf):
        x = dt.type(v)
        for _ in range(steps + 1):
            out.append(float(x))
            x = np.nextafter(x, dt.type(direction))
    return out


def _candidates(root: str, thresholds: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Root values at and beside each threshold and each float32/float16 midpoint around it."""
    dt = np.dtype(root)
    points: list[float] = [lo, hi]
    for b in thresholds.astype(np.float64).tolist():
        if not math.isfinite(b):
            b = math.copysign(float(np.finfo(np.float16).max) * 1.0005, b)
        points += _near(b, dt)
        for narrow in (np.float32, np.float16):
            c = narrow(b)
            if np.isfinite(c):
                for side in (-np.inf, np.inf):
                    mid = (float(c) + float(np.nextafter(c, narrow(side)))) / 2
                    points += _near(mid, dt)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.array([p for p in points if lo <= p <= hi], dtype=np.float64).astype(dt)
    return np.unique(v[(v >= lo) & (v <= hi)])


CASES = {
    # float64 rounded to float32 near 1 (thresholds one float32 step apart)
    "float64->float32": (
        "float64",
        ["float32"],
        (0.5, 2.0),
        np.array([1.0, np.nextafter(F32(1), F32(2)), np.nextafter(F32(1), F32(0))], dtype=F32),
    ),
    # every value of the column below the edge, the highest ones rounded onto it
    "float64->float32 below an edge": (
        "float64",
        ["float32"],
        (1.0 - 2.0**-23, 1.0 - 2.0**-30),
        np.array([1.0], dtype=F32),
    ),
    # integers beyond 2^24 round to even in float32
    "int64->float32": (
        "int64",
        ["float32"],
        (2.0**24 - 300, 2.0**24 + 12),  # too wide for an integer table
        np.array([2**24, 2**24 + 2, 2**24 + 4, 2**24 + 8], dtype=F32),
    ),
    # float32 widened: thresholds between float32 values
    "float32->float64": (
        "float32",
        ["float64"],
        (0.5, 2.0),
        np.array([1.0 + 2.0**-30, 1.0, 1.0 - 2.0**-30]),
    ),
    # float16 overflows to inf from 65520 on
    "float64->float16": (
        "float64",
        ["float16"],
        (60000.0, 70000.0),
        np.array([65504.0, np.inf, 65500.0], dtype=F32),
    ),
    # two roundings: float64 to float16, then to float32
    "float64->float16->float32": (
        "float64",
        ["float16", "float32"],
        (0.9, 1.1),
        np.array([1.0, 1.0 + 2.0**-10, 1.0 - 2.0**-11, 1.0 + 2.0**-11], dtype=F32),
    ),
    # float32's subnormals flush to zero in the engine
    "float64->float32 subnormal": (
        "float64",
        ["float32"],
        (-1e-37, 1e-37),
        np.array([0.0, np.finfo(F32).smallest_normal, -np.finfo(F32).smallest_normal], dtype=F32),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cast_compared_with_thresholds_is_cut_where_it_crosses_them(case: str) -> None:
    root, chain, (lo, hi), thresholds = CASES[case]
    b = GraphBuilder()
    x = b.input("x", root, (1,))
    v = x
    for dt in chain:
        v = b.op("convert_element_type", v, dtype=dt)
    u = b.op("unsqueeze", v, dim=1)
    t = b.constant(thresholds[None, :])
    # overlapping indicators, weighted: a value's code in 0..7 per threshold (integers:
    # exact, as the tables are)
    code = None
    for op, weight in (("ge", 1), ("lt", 2), ("eq", 4)):
        hit = b.op("mul", b.op("convert_element_type", b.op(op, u, t), dtype="int64"), weight)
        code = hit if code is None else b.op("add", code, hit)
    assert code is not None
    graph = b.build([code])
    report = track(graph, {"x": InputSpec.private(lo, hi)})
    out = report.outputs[0]
    assert out.l1 < 7 * len(thresholds) - 1  # tabulated, not the general bound
    p = plan(graph, accurate=True)
    values = {
        float(r): run(p, {"x": np.array([r])}).outputs[0].ravel().astype(np.float64)
        for r in _candidates(root, thresholds, lo, hi)
    }
    worst1 = worst2 = 0.0
    for a, c in itertools.combinations(values.values(), 2):
        worst1 = max(worst1, float(np.abs(a - c).sum()))
        worst2 = max(worst2, float(np.sqrt(((a - c) ** 2).sum())))
    assert worst1 <= out.l1 and worst2 <= out.l2
    assert out.exact_l1 == worst1  # every piece is reached by some value: cut right
    assert out.exact_l2 == pytest.approx(worst2, rel=1e-12)


def test_a_histogram_of_a_cast_column_is_charged_as_one_of_the_column() -> None:
    # the interval form of a histogram: ((x >= lo) & (x < hi)), over float32 edges
    edges = np.linspace(0.0, 1e6, 11).astype(F32)
    for root, chain in (("float64", ["float32"]), ("int64", ["float32"]), ("float32", ["float64"])):
        b = GraphBuilder()
        v = b.input("x", root, (50,))
        for dt in chain:
            v = b.op("convert_element_type", v, dtype=dt)
        u = b.op("unsqueeze", v, dim=1)
        inside = b.op(
            "logical_and",
            b.op("ge", u, b.constant(edges[:-1])),
            b.op("lt", u, b.constant(edges[1:])),
        )
        hist = b.op("sum", b.op("convert_element_type", inside, dtype="float32"), dims=(0,))
        report = track(b.build([hist]), {"x": InputSpec.private(0, 2e6)})
        assert report.outputs[0].exact_l1 == 2.0, (root, chain)
