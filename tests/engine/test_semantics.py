"""Engine semantics beyond the OpInfo sweep: torch's special dtype rules, errors,
in-place safety, trackers, randomness, convolution backward and the wire format."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from dpnode.core.engine import (
    REGISTRY,
    GraphBuilder,
    Node,
    TensorMeta,
    decode,
    encode,
    evaluate,
    infer,
    plan,
    run,
    structure_hash,
)
from dpnode.core.engine.evaluator import Call
from dpnode.core.errors import EvaluationError, GraphError
from tests.engine.decomp import TORCH_TO_NAME, to_numpy


def _unary_graph(op: str, dtype: str, shape: tuple[int, ...], *args: Any, **attrs: Any) -> Any:
    b = GraphBuilder()
    x = b.input("x", dtype, shape)
    return b.build([b.op(op, x, *args, **attrs)])


@pytest.mark.parametrize(
    ("a", "ka", "b", "kb", "want"),
    [
        ("int64", (3,), "float32", (3,), "float32"),
        ("int32", (3,), 1.5, None, "float32"),
        ("float16", (3,), "float64", (), "float16"),
        ("bool", (3,), "bool", (3,), "bool"),
        ("int8", (3,), "int64", (), "int8"),
        ("uint8", (3,), "int8", (3,), "int16"),
        ("bfloat16", (3,), "float16", (3,), "float32"),
        ("bool", (3,), 2, None, "int64"),
    ],
)
def test_promotion_examples(a: str, ka: Any, b: Any, kb: Any, want: str) -> None:
    g = GraphBuilder()
    x = g.input("a", a, ka)
    y = g.input("b", b, kb) if kb is not None else b
    assert infer(g.build([g.op("add", x, y)]))[0].dtype.name == want


def test_int_true_division_and_float_functions_give_float32() -> None:
    assert infer(_unary_graph("div", "int64", (2,), 2))[0].dtype.name == "float32"
    assert infer(_unary_graph("exp", "int16", (2,)))[0].dtype.name == "float32"
    assert infer(_unary_graph("sum", "bool", (2,)))[0].dtype.name == "int64"
    assert infer(_unary_graph("lt", "float16", (2,), 1.0))[0].dtype.name == "bool"


def test_integer_division_by_zero_names_the_node() -> None:
    for op in ("floor_divide", "remainder", "fmod", "trunc_divide"):
        g = GraphBuilder()
        x = g.input("x", "int64", (3,))
        y = g.input("y", "int64", (3,))
        graph = g.build([g.op(op, x, y)])
        with pytest.raises(
            EvaluationError, match=rf"node 2 \({op}\), argument 1: integer division by zero"
        ):
            evaluate(graph, {"x": np.arange(3), "y": np.array([1, 0, 2])})
    # floats divide by zero to inf, like torch
    out = evaluate(
        _unary_graph("floor_divide", "float32", (1,), 0.0), {"x": np.ones(1, np.float32)}
    )[0]
    assert np.isinf(out).all()


def test_integer_pow_negative_scalar_refused_tensor_follows_torch() -> None:
    with pytest.raises(GraphError, match="negative integer powers"):
        infer(_unary_graph("pow", "int64", (3,), -1))
    g = GraphBuilder()
    x = g.input("x", "int64", (4,))
    e = g.input("e", "int64", (4,))
    base, exp = np.array([1, -1, 2, -1]), np.array([-1, -3, -2, 2])
    got = evaluate(g.build([g.op("pow", x, e)]), {"x": base, "e": exp})[0]
    assert got.tolist() == torch.pow(torch.tensor(base), torch.tensor(exp)).tolist()


def test_integer_overflow_wraps_silently() -> None:
    out = evaluate(_unary_graph("mul", "uint8", (2,), 300), {"x": np.array([1, 2], np.uint8)})[0]
    assert out.tolist() == (torch.tensor([1, 2], dtype=torch.uint8) * 300).tolist()
    big = np.array([2**62], np.int64)
    assert evaluate(_unary_graph("mul", "int64", (1,), 4), {"x": big})[0].tolist() == [0]


def test_nan_propagates_through_max_min_and_amax() -> None:
    x = np.array([1.0, np.nan, 3.0], np.float32)
    g = GraphBuilder()
    a = g.input("x", "float32", (3,))
    graph = g.build(
        [g.op("maximum", a, 2.0), g.op("amax", a), g.op("clamp", a, 0.0, 2.0), g.op("argmax", a)]
    )
    mx, am, cl, arg = evaluate(graph, {"x": x})
    t = torch.from_numpy(x)
    assert np.array_equal(mx, torch.maximum(t, torch.tensor(2.0)).numpy(), equal_nan=True)
    assert np.isnan(am) and np.isnan(cl[1]) and arg == torch.argmax(t).item()


def test_float16_reductions_accumulate_in_float32() -> None:
    x = np.full(4096, 1.0, np.float16)  # float16 sums stall at 2048 without opmath
    got = evaluate(_unary_graph("sum", "float16", (4096,)), {"x": x})[0]
    assert got.dtype == np.float16 and float(got) == torch.from_numpy(x).sum().item() == 4096.0


def test_inplace_reuse_never_clobbers_a_live_view() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (2, 3))
    e = b.op("exp", x)
    v = b.op("reshape", e, shape=[6])  # a view of e, still needed below
    n = b.op("neg", e)  # e's last use: must not be written in place while v lives
    out = b.op("add", b.op("reshape", n, shape=[6]), v)
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.allclose(evaluate(b.build([out]), {"x": xv})[0], 0.0)
    assert np.array_equal(xv, np.arange(6, dtype=np.float32).reshape(2, 3))  # inputs untouched


def test_inplace_reuse_happens_for_dying_intermediates() -> None:
    class Ids:
        name = "ids"

        def visit(
            self, index: int, node: Node, call: Call | None, meta: TensorMeta, arg_states: list[Any]
        ) -> Any:
            return index

    b = GraphBuilder()
    x = b.input("x", "float32", (1000,))
    y = b.op("exp", x)
    z = b.op("mul", y, 2.0)
    w = b.op("add", z, 1.0)
    res = run(b.build([w]), {"x": np.zeros(1000, np.float32)}, trackers=[Ids()])
    assert res.tracked == {"ids": [3]}
    assert np.allclose(res.outputs[0], 3.0)
    assert plan(b.build([w])).peak_bytes == 2 * 4000  # the plan's bound: two live at once
    # the run does better: z and w are written into y's buffer, so one array is allocated
    import tracemalloc

    big = GraphBuilder()
    bx = big.input("x", "float32", (1_000_000,))
    graph = big.build([big.op("add", big.op("mul", big.op("exp", bx), 2.0), 1.0)])
    xv = np.zeros(1_000_000, np.float32)
    tracemalloc.start()
    evaluate(graph, {"x": xv})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1.3 * xv.nbytes


def test_tracker_sees_arguments_states() -> None:
    class Depth:
        name = "depth"

        def visit(
            self, index: int, node: Node, call: Call | None, meta: TensorMeta, arg_states: list[Any]
        ) -> Any:
            return 1 + max((s for s in arg_states if s is not None), default=0)

    b = GraphBuilder()
    x = b.input("x", "float32", (2,))
    y = b.op("add", b.op("exp", x), x)
    res = run(b.build([y, x]), {"x": np.ones(2, np.float32)}, trackers=[Depth()])
    assert res.tracked["depth"] == [3, 1]
    assert all(p.rules == {} for p in REGISTRY.values())  # the slot later layers fill


def test_rand_uses_the_nodes_generator() -> None:
    b = GraphBuilder()
    r = b.op("rand", shape=[1000], dtype="float32")
    g = b.build([b.op("lt", r, 0.5)])
    a = evaluate(g, {}, rng=np.random.default_rng(7))[0]
    c = evaluate(g, {}, rng=np.random.default_rng(7))[0]
    assert np.array_equal(a, c) and 400 < a.sum() < 600
    u = evaluate(b.build([r]), {})[0]
    assert u.dtype == np.float32 and (u >= 0).all() and (u < 1).all()


def test_arange_and_full_match_torch() -> None:
    for start, end, step, dt in [
        (0, 10, 3, "int64"),
        (0.5, 2.0, 0.25, "float32"),
        (5, -1, -2, "int64"),
    ]:
        b = GraphBuilder()
        g = b.build(
            [b.op("arange", start=float(start), end=float(end), step=float(step), dtype=dt)]
        )
        got = evaluate(g, {})[0]
        want = torch.arange(
            start, end, step, dtype={"int64": torch.int64, "float32": torch.float32}[dt]
        )
        assert got.dtype.name == TORCH_TO_NAME[want.dtype] and np.array_equal(got, want.numpy())


def test_slice_with_step_and_index_put_accumulate() -> None:
    x = np.arange(10, dtype=np.int64)
    got = evaluate(
        _unary_graph("slice", "int64", (10,), dim=0, start=1, end=None, step=3), {"x": x}
    )[0]
    assert got.tolist() == torch.arange(10)[1::3].tolist()
    b = GraphBuilder()
    a = b.input("a", "float32", (5,))
    i = b.input("i", "int64", (3,))
    v = b.input("v", "float32", (3,))
    g = b.build([b.op("index_put", a, v, i, accumulate=True)])
    idx = np.array([0, 0, 4])
    got = evaluate(g, {"a": np.zeros(5, np.float32), "i": idx, "v": np.ones(3, np.float32)})[0]
    want = torch.zeros(5).index_put((torch.tensor(idx),), torch.ones(3), accumulate=True)
    assert got.tolist() == want.tolist()


def test_gather_out_of_range_is_an_evaluation_error() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    i = b.input("i", "int64", (2,))
    g = b.build([b.op("gather", x, i, dim=0)])
    with pytest.raises(EvaluationError, match=r"node 2 \(gather\), argument 1: index out of range"):
        evaluate(g, {"x": np.zeros(3, np.float32), "i": np.array([0, -1])})


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups"),
    [((1, 1), (0, 0), (1, 1), 1), ((2, 1), (1, 2), (1, 2), 2), ((3, 2), (2, 0), (2, 1), 1)],
)
def test_convolution_backward_matches_autograd(
    stride: Any, padding: Any, dilation: Any, groups: int
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 4 // groups, 3, 2, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, groups)
    gy = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), gy)
    b = GraphBuilder()
    xi = b.input("x", "float64", tuple(x.shape))
    wi = b.input("w", "float64", tuple(w.shape))
    gi = b.input("gy", "float64", tuple(gy.shape))
    outpad = [
        x.shape[2 + i]
        - (
            (y.shape[2 + i] - 1) * stride[i]
            - 2 * padding[i]
            + dilation[i] * (w.shape[2 + i] - 1)
            + 1
        )
        for i in range(2)
    ]
    conv = dict(stride=list(stride), padding=list(padding), dilation=list(dilation), groups=groups)
    grad_x = b.op("convolution", gi, wi, None, transposed=True, output_padding=outpad, **conv)
    grad_w = b.op("convolution_weight_grad", xi, gi, kernel_size=list(w.shape[2:]), **conv)
    fwd = b.op("convolution", xi, wi, None, **conv)
    got = evaluate(
        b.build([fwd, grad_x, grad_w]), {"x": to_numpy(x), "w": to_numpy(w), "gy": to_numpy(gy)}
    )
    for g_, t_ in zip(got, (y, gx, gw), strict=True):
        torch.testing.assert_close(torch.from_numpy(g_), t_.detach())


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "kw"),
    [
        (
            (2, 2, 4, 4),
            (2, 2, 4, 5),
            dict(stride=[3, 2], padding=[1, 2], output_padding=[2, 3], groups=2, dilation=[4, 4]),
        ),
        (
            (2, 4, 6),
            (4, 2, 3),
            dict(stride=[3], padding=[1], output_padding=[2], groups=2, dilation=[4]),
        ),
        (
            (1, 4, 5),
            (4, 8, 3),
            dict(stride=[1], padding=[0], output_padding=[0], groups=1, dilation=[1]),
        ),
    ],
)
def test_conv_transpose_float16_accuracy(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], kw: dict[str, Any]
) -> None:
    """The documented float16 exception: the engine is at least as close to float64 as torch."""
    torch.manual_seed(0)
    x = torch.randn(*x_shape, dtype=torch.float16)
    w = torch.randn(*w_shape, dtype=torch.float16)
    conv = (
        torch.nn.functional.conv_transpose1d
        if len(x_shape) == 3
        else torch.nn.functional.conv_transpose2d
    )
    ref = conv(x.double(), w.double(), **kw)
    th = conv(x, w, **kw)
    b = GraphBuilder()
    xi, wi = b.input("x", "float16", x_shape), b.input("w", "float16", w_shape)
    g = b.build([b.op("convolution", xi, wi, None, transposed=True, **kw)])
    got = torch.from_numpy(evaluate(g, {"x": to_numpy(x), "w": to_numpy(w)})[0]).double()
    assert (got - ref).abs().max() <= (th.double() - ref).abs().max()


def test_wire_roundtrip_is_canonical_and_structure_hash_ignores_values() -> None:
    def graph(wv: np.ndarray[Any, Any]) -> Any:
        b = GraphBuilder()
        x = b.input("dataset:3/age", "float32", (5, 3))
        w = b.constant(wv)
        return b.build([b.op("sum", b.op("matmul", x, w), dims=[0], keepdim=True)])

    g1, g2 = graph(np.ones((3, 2), np.float32)), graph(np.zeros((3, 2), np.float32))
    f1 = encode(g1)
    d1 = decode(f1)
    assert encode(d1) == f1
    assert structure_hash(g1) == structure_hash(g2) == structure_hash(d1)
    assert encode(g1) != encode(g2)
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    assert np.array_equal(
        evaluate(d1, {"dataset:3/age": x})[0], evaluate(g1, {"dataset:3/age": x})[0]
    )
    assert not d1.nodes[1].value.flags.writeable  # type: ignore[union-attr]


def test_wire_scalars_keep_their_python_type_and_infinities() -> None:
    b = GraphBuilder()
    x = b.input("x", "int32", (2,))
    g = b.build(
        [
            b.op("add", x, 2),
            b.op("add", x, 2.0),
            b.op("maximum", x, float("-inf")),
            b.op("add", x, True),
        ]
    )
    d = decode(encode(g))
    assert [m.dtype.name for m in infer(d)] == ["int32", "float32", "float32", "int32"]


def test_bfloat16_roundtrip_and_compute() -> None:
    import ml_dtypes

    x = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
    b = GraphBuilder()
    xi = b.input("x", "bfloat16", (3,))
    c = b.constant(x)
    g = decode(encode(b.build([b.op("mul", xi, c), b.op("exp", xi)])))
    m, e = evaluate(g, {"x": x})
    t = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    assert m.dtype == ml_dtypes.bfloat16 and np.array_equal(
        m.astype(np.float32), (t * t).float().numpy()
    )
    assert np.allclose(e.astype(np.float32), t.exp().float().numpy(), rtol=1e-2)


def test_engine_import_does_not_import_torch() -> None:
    code = "import sys, dpnode.core.engine; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("shape", "indices"),
    [
        ((5,), [[0, -1, 2]]),
        ((4, 5), [None, [[0, 1], [4, 3]]]),
        ((4, 5, 6), [[0, 3], None, [5, -6]]),  # separated: index dims go first
        ((4, 5, 6), [None, [1, 2], [0, 5]]),  # adjacent: they stay in place
        ((3, 4), [[[0], [2]], [1, 3]]),  # broadcast index shapes
    ],
)
def test_index_matches_torch(shape: tuple[int, ...], indices: list[Any]) -> None:
    x = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    tidx = [None if i is None else torch.tensor(i) for i in indices]
    want = x[tuple(slice(None) if i is None else i for i in tidx)]
    b = GraphBuilder()
    xi = b.input("x", "float32", shape)
    feed = {"x": to_numpy(x)}
    refs: list[Any] = []
    for k, i in enumerate(tidx):
        if i is None:
            refs.append(None)
        else:
            refs.append(b.input(f"i{k}", "int64", tuple(i.shape)))
            feed[f"i{k}"] = to_numpy(i)
    g = b.build([b.op("index", xi, *refs)])
    assert infer(g)[0].shape == tuple(want.shape)
    assert np.array_equal(evaluate(g, feed)[0], want.numpy())


def test_index_out_of_range() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (3,))
    i = b.input("i", "int64", (1,))
    g = b.build([b.op("index", x, i)])
    with pytest.raises(EvaluationError, match="index out of range"):
        evaluate(g, {"x": np.zeros(3, np.float32), "i": np.array([3])})


def test_max_and_avg_pool_through_unfold() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8)
    b = GraphBuilder()
    xi = b.input("x", "float32", (2, 3, 9, 8))
    padded = b.op("pad", xi, pad=[1, 1, 1, 1], value=float("-inf"))
    win = b.op("unfold", b.op("unfold", padded, dim=2, size=3, step=2), dim=3, size=3, step=2)
    mx = b.op("amax", win, dims=[-2, -1])
    avg = b.op(
        "mean",
        b.op("unfold", b.op("unfold", xi, dim=2, size=2, step=2), dim=3, size=2, step=2),
        dims=[-2, -1],
    )
    got_max, got_avg = evaluate(b.build([mx, avg]), {"x": to_numpy(x)})
    want_max = torch.nn.functional.max_pool2d(x, 3, 2, padding=1)
    torch.testing.assert_close(torch.from_numpy(got_max), want_max)
    torch.testing.assert_close(torch.from_numpy(got_avg), torch.nn.functional.avg_pool2d(x, 2))


def test_outputs_never_alias_inputs_constants_or_each_other() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (2, 3))
    c = b.constant(np.ones(3, np.float32))
    e = b.op("exp", x)
    g = b.build(
        [
            x,
            b.op("reshape", x, shape=[6]),
            c,
            e,
            e,
            b.op("permute", e, dims=[1, 0]),
            b.op("expand", b.op("neg", c), shape=[4, 3]),
        ]
    )
    xv = np.zeros((2, 3), np.float32)
    outs = evaluate(g, {"x": xv})
    for k, o in enumerate(outs):
        assert not np.may_share_memory(o, xv)
        assert all(not np.may_share_memory(o, p) for p in outs[:k])
        assert o.flags.writeable
    outs[3] += 1  # writable, and writing does not leak into the other outputs
    assert np.array_equal(outs[4], np.ones((2, 3), np.float32))


def test_inplace_clamp_does_not_overwrite_a_dying_bound() -> None:
    b = GraphBuilder()
    x = b.input("x", "float32", (4,))
    lo = b.op("mul", b.input("l", "float32", (4,)), 1.0)  # an intermediate that dies at clamp
    g = b.build([b.op("clamp", x, lo, None)])
    xv = np.array([0.0, 5.0, -1.0, 2.0], np.float32)
    lv = np.array([1.0, 1.0, 1.0, 3.0], np.float32)
    got = evaluate(g, {"x": xv, "l": lv})[0]
    assert got.tolist() == torch.clamp(torch.from_numpy(xv), min=torch.from_numpy(lv)).tolist()


@pytest.mark.parametrize("op", ["trunc_divide", "floor_divide", "remainder", "fmod", "pow", "sub"])
@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_inplace_binary_into_either_dying_operand(op: str, dtype: str) -> None:
    """Whichever operand donates its buffer, the result equals torch's."""
    a = np.array([7, -7, 9, -9, 3], dtype=dtype)
    bv = np.array([2, 2, -4, -4, 3], dtype=dtype)
    fn = {
        "trunc_divide": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
        "floor_divide": torch.floor_divide,
        "remainder": torch.remainder,
        "fmod": torch.fmod,
        "pow": torch.pow,
        "sub": torch.sub,
    }[op]
    want = fn(torch.from_numpy(a), torch.from_numpy(np.abs(bv) if op == "pow" else bv))
    for donor in (0, 1):
        b = GraphBuilder()
        x = b.input("a", dtype, (5,))
        y = b.input("b", dtype, (5,))
        if op == "pow":
            y = b.op("abs", y)
        args = [x, y]
        args[donor] = b.op("mul", args[donor], 1)  # a dying intermediate of the output's shape
        got = evaluate(b.build([b.op(op, *args)]), {"a": a, "b": bv})[0]
        assert got.tolist() == want.tolist(), (op, dtype, donor)


def test_convolutions_match_torch_across_geometries() -> None:
    """Forward and transposed convolutions, 1-3 spatial dims, groups, strides, dilations,
    paddings (wider than the kernel's reach: the transposed one then crops) and output
    paddings, against torch in float64."""
    rng = np.random.default_rng(11)
    forward = {
        1: torch.nn.functional.conv1d,
        2: torch.nn.functional.conv2d,
        3: torch.nn.functional.conv3d,
    }
    transposed = {
        1: torch.nn.functional.conv_transpose1d,
        2: torch.nn.functional.conv_transpose2d,
        3: torch.nn.functional.conv_transpose3d,
    }
    checked = 0
    while checked < 60:
        nsp = int(rng.integers(1, 4))
        g = int(rng.choice([1, 2, 3]))
        cg, og = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        k = [int(rng.integers(1, 4)) for _ in range(nsp)]
        stride = [int(rng.integers(1, 4)) for _ in range(nsp)]
        dilation = [int(rng.integers(1, 3)) for _ in range(nsp)]
        padding = [int(rng.integers(0, 4)) for _ in range(nsp)]
        size = [int(rng.integers(2, 7)) for _ in range(nsp)]
        is_t = bool(rng.integers(0, 2))
        outpad = [int(rng.integers(0, min(s, d))) for s, d in zip(stride, dilation, strict=True)]
        x = torch.from_numpy(rng.standard_normal((2, g * cg, *size)))
        if is_t:
            w = torch.from_numpy(rng.standard_normal((g * cg, og, *k)))
            kw = dict(
                stride=stride, padding=padding, output_padding=outpad, groups=g, dilation=dilation
            )
            try:
                ref = transposed[nsp](x, w, **kw)
            except RuntimeError:
                continue  # a geometry torch refuses
        else:
            w = torch.from_numpy(rng.standard_normal((g * og, cg, *k)))
            kw = dict(stride=stride, padding=padding, groups=g, dilation=dilation)
            try:
                ref = forward[nsp](x, w, **kw)
            except RuntimeError:
                continue
        b = GraphBuilder()
        xi = b.input("x", "float64", tuple(x.shape))
        wi = b.input("w", "float64", tuple(w.shape))
        g_ = b.build([b.op("convolution", xi, wi, None, transposed=is_t, **kw)])
        got = evaluate(g_, {"x": to_numpy(x), "w": to_numpy(w)})[0]
        torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(got)), ref, msg=str(kw))
        checked += 1
