"""The readable listing of a graph an admin approves: torch's names, shapes, bounded size."""

from __future__ import annotations

import numpy as np

from dpnode.core.engine import GraphBuilder, plan
from dpnode.core.engine.listing import MAX_LINE, MAX_LINES, listing


def test_operators_methods_constants_and_inputs_read_as_torch() -> None:
    b = GraphBuilder()
    age = b.input("dataset:3/age", "int64", (5,))
    w = b.input("model:2/w", "float32", (5,))
    scaled = b.op("mul", b.op("convert_element_type", age, dtype="float32"), 0.5)
    shifted = b.op("sub", scaled, b.constant(np.array(1.0, dtype=np.float32)))
    out = b.op("sum", b.op("mul", shifted, w), dims=[0])
    lines = listing(
        plan(b.build([out, b.op("neg", out)])),
        {"dataset:3/age": 'clinic["age"]  bounds [0, 120]', "model:2/w": 'm["w"]  public weights'},
        release="shapes (), (), L1 sensitivity 12, laplace scale 24",
    )
    assert lines == [
        'x0 = clinic["age"]   # int64 (5,) bounds [0, 120]',
        'x1 = m["w"]   # float32 (5,) public weights',
        "x2 = x0.to(dtype=float32)   # float32 (5,)",
        "x3 = x2 * 0.5   # float32 (5,)",
        "x4 = tensor(1.0, dtype=float32)   # float32 ()",
        "x5 = x3 - x4   # float32 (5,)",
        "x6 = x5 * x1   # float32 (5,)",
        "x7 = x6.sum(dims=[0])   # float32 ()",
        "x8 = -x7   # float32 ()",
        "release x7, x8  # shapes (), (), L1 sensitivity 12, laplace scale 24",
    ]


def test_an_input_without_a_label_is_named_as_on_the_wire() -> None:
    b = GraphBuilder()
    x = b.input("dataset:9/x", "float64", (3,))
    assert listing(plan(b.build([b.op("exp", x)])), {})[:2] == [
        "x0 = 'dataset:9/x'   # float64 (3,)",
        "x1 = x0.exp()   # float64 (3,)",
    ]


def test_a_graph_of_ten_thousand_prims_lists_its_first_lines_and_a_count() -> None:
    b = GraphBuilder()
    value = b.input("dataset:1/x", "float64", (4,))
    for _ in range(10_000):
        value = b.op("add", value, 1.0)
    lines = listing(plan(b.build([b.op("sum", value, dims=[0])])), {})
    assert len(lines) == MAX_LINES + 2
    assert lines[-2] == f"# ... {10_002 - MAX_LINES} more lines not shown"
    assert lines[-1] == "release x10001"
    assert sum(len(line) for line in lines) < 10_000


def test_long_lines_are_cut_and_large_constants_named_by_shape() -> None:
    b = GraphBuilder()
    x = b.input("dataset:1/c", "float64", (7,))
    y = b.op("add", x, b.constant(np.arange(7.0)))
    lines = listing(plan(b.build([y])), {"dataset:1/c": "c" * 300}, release="r" * 1000)
    assert all(len(line) <= MAX_LINE for line in lines)
    assert lines[0].endswith("…") and lines[-1].endswith("…")
    assert lines[1] == "x1 = constant(float64, shape=[7])   # float64 (7,)"
