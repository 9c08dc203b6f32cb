"""Hostile graphs and frames are refused before any allocation, with a reason."""

from __future__ import annotations

import json
import struct
import tracemalloc
from typing import Any

import numpy as np
import pytest

from dpnode.core.engine import (
    GraphBuilder,
    Quotas,
    WireLimits,
    decode,
    encode,
    evaluate,
    infer,
    plan,
)
from dpnode.core.engine.graph import Graph, Node, Ref, validate_structure
from dpnode.core.engine.prims.registry import Scalar
from dpnode.core.engine.wire import MAGIC, Layout, decode_layout, hollow_constants, rebind
from dpnode.core.errors import (
    GraphError,
    PayloadTooLargeError,
    QuotaExceededError,
    UnsupportedDTypeError,
)


def _small() -> Graph:
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    return b.build([b.op("exp", x)])


def test_unknown_prim_is_named() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    g = b.build([b.op("system", x)])
    with pytest.raises(GraphError, match=r"node 1 \('system'\): unknown prim"):
        infer(g)


def test_cycle_and_forward_reference_refused() -> None:
    g = Graph(
        (
            Node("input", (), {"name": "x", "dtype": "float32", "shape": (2,)}),
            Node("neg", (Ref(1),)),
        ),
        (1,),
    )
    with pytest.raises(GraphError, match="cycle or forward reference"):
        infer(g)
    g2 = Graph(
        (
            Node("input", (), {"name": "x", "dtype": "float32", "shape": (2,)}),
            Node("add", (Ref(0), Ref(2))),
            Node("neg", (Ref(1),)),
        ),
        (2,),
    )
    with pytest.raises(GraphError, match=r"node 1 \('add'\), argument 1: refers to node 2"):
        infer(g2)


def test_dangling_reference_and_output() -> None:
    g = Graph(
        (
            Node("input", (), {"name": "x", "dtype": "float32", "shape": (2,)}),
            Node("neg", (Ref(-1),)),
        ),
        (1,),
    )
    with pytest.raises(GraphError, match="dangling reference"):
        infer(g)
    with pytest.raises(GraphError, match="output refers to node 7"):
        infer(Graph(_small().nodes, (7,)))


def test_validation_is_remembered_only_for_the_graph_it_returned() -> None:
    # a publish decodes, plans and hashes one graph: validated once; a graph made from a
    # validated one's parts is still checked
    g = decode(encode(_small()), WireLimits())
    assert validate_structure(g) is g
    with pytest.raises(GraphError, match="output refers to node 7"):
        validate_structure(Graph(g.nodes, (7,)))
    bad = Graph((*g.nodes, Node("neg", (Ref(99),))), (len(g.nodes),))
    with pytest.raises(GraphError, match=r"refers to node 99"):
        plan(bad)


def test_huge_shape_refused_before_allocation() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    big = b.op("expand", b.op("reshape", x, shape=[3, 1]), shape=[3, 10**12])
    g = b.build([b.op("exp", big)])
    tracemalloc.start()
    try:
        with pytest.raises(
            QuotaExceededError, match=r"node 2 \(expand\).*3,000,000,000,000 elements"
        ):
            evaluate(g, {"x": np.ones(3, np.float32)})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # nothing near the tensor's size was allocated


def test_huge_full_and_input_refused() -> None:
    b = GraphBuilder()
    g = b.build([b.op("full", shape=[10**6, 10**6], value=0.0, dtype="float32")])
    with pytest.raises(QuotaExceededError, match="elements"):
        infer(g)
    b = GraphBuilder()
    g = b.build([b.input("x", "float64", (10**12,))])
    with pytest.raises(QuotaExceededError):
        infer(g)


def test_peak_memory_quota_counts_live_intermediates() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (1000, 1000))
    y = b.op("exp", x)
    z = b.op("add", y, 1.0)
    g = b.build([b.op("mul", z, y)])
    p = plan(g)
    assert p.peak_bytes == 3 * 4_000_000  # y and z live, plus the output
    with pytest.raises(QuotaExceededError, match="bytes of intermediates"):
        plan(g, Quotas(max_total_bytes=10_000_000))


def test_flops_quota() -> None:
    b = GraphBuilder()
    a = b.input("a", "float32", (2000, 2000))
    g = b.build([b.op("matmul", a, a)])
    with pytest.raises(QuotaExceededError, match="estimated compute"):
        plan(g, Quotas(max_flops=10**9))


def test_deep_chain_refused_by_node_quota_without_recursion() -> None:
    n = 10**6
    x = Node("input", (), {"name": "x", "dtype": "float32", "shape": (1,)})
    nodes = (x,) + (Node("neg", (Ref(0),)),) * n
    with pytest.raises(QuotaExceededError, match="1000001 nodes"):
        infer(Graph(nodes, (n,)))
    # the same chain on the wire is refused by the frame's limits before parsing nodes
    body = (
        b'{"nodes":['
        + b",".join([b'{"op":"neg","args":[0]}'] * n)
        + b'],"outputs":[1],"version":"1"}'
    )
    with pytest.raises(PayloadTooLargeError, match="header"):
        decode(MAGIC + struct.pack("<Q", len(body)) + body)


def test_deep_chain_within_quota_evaluates_iteratively() -> None:
    n = 5_000  # deeper than Python's recursion limit
    x = Node("input", (), {"name": "x", "dtype": "int64", "shape": (2,)})
    nodes = (x, *tuple(Node("add", (Ref(i), Scalar(1))) for i in range(n)))
    out = evaluate(Graph(nodes, (n,)), {"x": np.zeros(2, np.int64)})[0]
    assert out.tolist() == [n, n]


def test_wrong_dtypes_refused() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    with pytest.raises(GraphError, match=r"node 1 \(bitwise_and\).*float32"):
        infer(b.build([b.op("bitwise_and", x, x)]))
    b = GraphBuilder()
    x = b.input("x", "complex64", (3,))
    with pytest.raises(UnsupportedDTypeError, match="complex"):
        infer(b.build([x]))
    b = GraphBuilder()
    x = b.input("x", "int64", (3,))
    with pytest.raises(GraphError, match="mean could not infer output dtype"):
        infer(b.build([b.op("mean", x)]))
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    c = b.input("c", "int64", (3,))
    with pytest.raises(GraphError, match="condition must be bool"):
        infer(b.build([b.op("where", c, x, x)]))


def test_nan_constants_and_attributes_refused() -> None:
    import ml_dtypes

    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        b = GraphBuilder()
        c = b.constant(np.array([1.0, np.nan], dt))
        with pytest.raises(GraphError, match="constant contains NaN"):
            infer(b.build([c]))
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    with pytest.raises(GraphError, match="NaN"):
        infer(b.build([b.op("add", x, float("nan"))]))
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    with pytest.raises(GraphError, match="attribute 'start' must be finite"):
        infer(b.build([b.op("arange", start=float("inf"), end=1.0, step=1.0, dtype="float32")]))
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    with pytest.raises(GraphError, match="NaN scalar refused"):
        infer(b.build([b.op("clamp", x, float("nan"), None)]))


def test_wrong_arity_attrs_and_scalar_positions() -> None:
    cases = [
        (("add",), {}, "takes 2 arguments, got 1"),
        (("exp",), {"bogus": 1}, "unknown attributes"),
        (("sum",), {"dims": "0"}, "attribute 'dims' must be ints"),
    ]
    for (op,), attrs, msg in cases:
        b = GraphBuilder()
        x = b.input("x", "float32", (3,))
        with pytest.raises(GraphError, match=msg):
            infer(b.build([b.op(op, x, **attrs)]))
    b = GraphBuilder()
    with pytest.raises(GraphError, match="argument 0: must be a tensor"):
        infer(b.build([b.op("exp", 2.0)]))


def test_input_mismatch_is_an_evaluation_error() -> None:
    from dpnode.core.errors import EvaluationError

    with pytest.raises(EvaluationError, match="declared float32\\[3\\], got float64\\[3\\]"):
        evaluate(_small(), {"x": np.ones(3)})
    with pytest.raises(EvaluationError, match="no value given for input 'x'"):
        evaluate(_small(), {})
    with pytest.raises(EvaluationError, match="not declared"):
        evaluate(_small(), {"x": np.ones(3, np.float32), "y": np.ones(1)})


# -- malformed frames ----------------------------------------------------------


def _frame(header: Any, buf: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return MAGIC + struct.pack("<Q", len(h)) + h + buf


def test_truncated_and_garbage_frames() -> None:
    f = encode(_small())
    for cut in (0, 3, 11, len(f) - 5):
        with pytest.raises(GraphError, match="malformed graph frame"):
            decode(f[:cut])
    with pytest.raises(GraphError, match="magic"):
        decode(b"PK\x03\x04" + f[4:])
    with pytest.raises(GraphError, match="not valid JSON"):
        decode(MAGIC + struct.pack("<Q", 4) + b"{{{{")


def test_huge_header_length_refused() -> None:
    f = MAGIC + struct.pack("<Q", 2**63) + b"{}"
    with pytest.raises(PayloadTooLargeError, match="header"):
        decode(f)
    with pytest.raises(PayloadTooLargeError, match="frame"):
        decode(b"x" * 100, WireLimits(max_frame_bytes=10))


def test_constant_offsets_outside_buffer_refused() -> None:
    node = {
        "op": "constant",
        "constant": {"dtype": "float32", "shape": [4], "offset": 8, "nbytes": 16},
    }
    hdr = {"version": "1", "nodes": [node], "outputs": [0]}
    with pytest.raises(GraphError, match="outside the 16-byte buffer"):
        decode(_frame(hdr, b"\0" * 16))
    node["constant"] = {"dtype": "float32", "shape": [10**12], "offset": 0, "nbytes": 16}
    with pytest.raises(GraphError, match="do not hold"):
        decode(_frame(hdr, b"\0" * 16))


def test_version_mismatch_and_unknown_fields() -> None:
    with pytest.raises(GraphError, match="version '2'"):
        decode(_frame({"version": "2", "nodes": [], "outputs": []}))
    with pytest.raises(GraphError, match="exactly version, nodes and outputs"):
        decode(_frame({"version": "1", "nodes": [], "outputs": [], "pickle": "x"}))
    hdr = {
        "version": "1",
        "nodes": [
            {"op": "input", "attrs": {"name": "x", "dtype": "float32", "shape": [2]}},
            {"op": "neg", "args": ["0"]},
        ],
        "outputs": [1],
    }
    with pytest.raises(GraphError, match="argument"):
        decode(_frame(hdr))


def test_json_nan_and_deep_nesting_refused() -> None:
    raw = b'{"version": "1", "nodes": [], "outputs": [NaN]}'
    with pytest.raises(GraphError, match="NaN"):
        decode(MAGIC + struct.pack("<Q", len(raw)) + raw)
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(GraphError):
        decode(MAGIC + struct.pack("<Q", len(deep)) + deep)


def test_bad_bool_constant_bytes() -> None:
    node = {"op": "constant", "constant": {"dtype": "bool", "shape": [2], "offset": 0, "nbytes": 2}}
    with pytest.raises(GraphError, match="bool constant"):
        decode(_frame({"version": "1", "nodes": [node], "outputs": [0]}, b"\x01\x07"))


def test_kernel_temporaries_count_in_the_memory_quota() -> None:
    # a convolution's window matrix is 9x its input: the peak must include it
    b = GraphBuilder()
    x = b.input("x", "float32", (8, 16, 64, 64))
    w = b.input("w", "float32", (16, 16, 3, 3))
    conv = b.op("convolution", x, w, None, stride=[1, 1], padding=[1, 1], dilation=[1, 1])
    p = plan(b.build([conv]))
    out_bytes = 8 * 16 * 64 * 64 * 4
    assert p.peak_bytes > 9 * out_bytes
    with pytest.raises(QuotaExceededError, match="bytes of intermediates"):
        plan(b.build([conv]), Quotas(max_total_bytes=4 * out_bytes))
    # and the estimate is honest: the real run stays within it (small Python objects aside)
    tracemalloc.start()
    evaluate(
        p,
        {"x": np.ones((8, 16, 64, 64), np.float32), "w": np.ones((16, 16, 3, 3), np.float32)},
    )
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak <= 1.01 * p.peak_bytes


def test_unknown_prim_on_the_wire_is_named_first() -> None:
    hdr = {
        "version": "1",
        "nodes": [{"op": "__import__", "attrs": {"name": ["os"]}}],
        "outputs": [0],
    }
    with pytest.raises(GraphError, match=r"node 0 \('__import__'\): unknown prim"):
        decode(_frame(hdr))


def _weights_graph(w: np.ndarray, mask: np.ndarray, k: int) -> Graph:
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    y = b.op("mul", x, b.constant(w))
    y = b.op("where", b.constant(mask), y, b.op("add", y, b.constant(np.array([k], np.int64))))
    return b.build([b.op("sum", y)])


def test_rebind_gives_each_frame_its_own_constants_and_checks_them() -> None:
    """A frame with a header seen before is rebuilt from the first one's hollow template:
    what decode would give, constants checked as decode checks them."""
    first = encode(_weights_graph(np.float32([1, 2, 3]), np.array([True, False, True]), 1))
    later = encode(_weights_graph(np.float32([-4, 5, 0.5]), np.array([False, False, True]), 7))
    graph, layout = decode_layout(first)
    assert [i for i, _ in layout.constants] == [1, 3, 4]  # w, mask, k
    hollow = hollow_constants(graph)
    assert all(n.value is None or n.value.strides == (0,) * n.value.ndim for n in hollow.nodes)
    rebuilt, expected = rebind(hollow, layout, later), decode(later)
    assert rebuilt.outputs == expected.outputs and len(rebuilt.nodes) == len(expected.nodes)
    for got, want in zip(rebuilt.nodes, expected.nodes, strict=True):
        assert (got.op, got.args, got.attrs) == (want.op, want.args, want.attrs)
        if want.value is not None:
            assert got.value is not None and got.value.dtype == want.value.dtype
            np.testing.assert_array_equal(got.value, want.value)
    x = np.float32([1, 1, 1])
    assert evaluate(rebuilt, {"x": x})[0] == evaluate(expected, {"x": x})[0]

    nan = bytearray(later)
    at = _offset_in(later, layout, 1) + 4  # w[1]
    nan[at : at + 4] = np.float32(np.nan).tobytes()
    with pytest.raises(GraphError, match="node 1 \\('constant'\\): constant contains NaN"):
        rebind(hollow, layout, bytes(nan))
    bad_bool = bytearray(later)
    bad_bool[_offset_in(later, layout, 3)] = 7  # the mask's first byte
    with pytest.raises(GraphError, match="bool constant holds bytes other than 0 and 1"):
        rebind(hollow, layout, bytes(bad_bool))
    with pytest.raises(GraphError, match="lie outside"):
        rebind(hollow, layout, later[:-20])
    with pytest.raises(PayloadTooLargeError, match="exceeds"):
        rebind(hollow, layout, later, WireLimits(max_frame_bytes=len(later) - 1))


def _offset_in(frame: bytes, layout: Layout, index: int) -> int:
    """Where constant node ``index``'s bytes start in ``frame``."""
    (hlen,) = struct.unpack("<Q", frame[4:12])
    return 12 + hlen + dict(layout.constants)[index]


def test_an_expand_to_a_negative_size_is_refused_when_planned() -> None:
    # a size-1 dim took any size, -2 included: the privacy rule's broadcast then raised
    # ValueError (a 500 from /sensitivity and /publish)
    b = GraphBuilder()
    x = b.input("x", "float64", (1,))
    with pytest.raises(GraphError, match="cannot expand to a negative size -2 at dim 0"):
        plan(b.build([b.op("expand", x, shape=[-2])]))
