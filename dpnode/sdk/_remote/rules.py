"""Our own ATen -> prim rules: elementwise math, casts, reductions, copies, factories.

A rule receives the op's meta output (torch's own shape and dtype for the
result) followed by the op's arguments, with every tensor already turned into a
:class:`~dpnode.sdk._remote.graph.Node` (whose ``shape`` and ``dtype`` are set). It
returns one node per output. Anything not here falls through to torch's
decomposition table (see ``dispatch.py``), so rules exist where a direct
mapping is shorter or more exact than torch's decomposition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dpnode.sdk._remote.dispatch import FACTORIES, PRIVATE, RULES
from dpnode.sdk._remote.graph import Node, prim

__all__ = ["dims_of", "dtype_name", "implements"]

aten = torch.ops.aten
Rule = Callable[..., Any]


def implements(*ops: Any) -> Callable[[Rule], Rule]:
    """Register a rule for ATen overloads (a packet registers every overload it has)."""

    def deco(fn: Rule) -> Rule:
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():  # type: ignore[no-untyped-call]
                    ov = getattr(op, name)
                    if "out" not in name:
                        RULES[ov] = fn
            else:
                RULES[op] = fn
        return fn

    return deco


def dtype_name(d: torch.dtype) -> str:
    from dpnode.sdk._remote.dispatch import _name

    return _name(d)


def dims_of(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """A dim argument as a tuple of non-negative dims (None: all)."""
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return None
    n = max(ndim, 1)
    return tuple(d % n for d in dim)


def _cast(x: Any, d: torch.dtype) -> Any:
    if isinstance(x, Node) and x.dtype is not None and x.dtype != d:
        return prim("convert_element_type", x, dtype=dtype_name(d))
    return x


# -- elementwise ---------------------------------------------------------------------------

_UNARY = [
    "abs",
    "neg",
    "exp",
    "exp2",
    "log",
    "log2",
    "log10",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "erf",
    "erfc",
    "erfinv",
    "sign",
    "floor",
    "ceil",
    "trunc",
    "bitwise_not",
    "isnan",
    "isinf",
    "signbit",
    "logical_not",
]
for _n in _UNARY:
    implements(getattr(aten, _n).default)(lambda out, x, _p=_n: prim(_p, x))

implements(aten.round.default)(lambda out, x: prim("round", x))
implements(aten.sgn.default)(lambda out, x: prim("sign", x))
implements(aten.positive.default)(lambda out, x: x)
implements(aten.isfinite.default)(lambda out, x: prim("isfinite", x))


@implements(aten.round.decimals)
def _round_decimals(out: torch.Tensor, x: Node, decimals: int = 0) -> Node:
    if decimals == 0:
        return prim("round", x)
    f = 10.0**decimals
    return prim("div", prim("round", prim("mul", x, f)), f)


@implements(aten.sigmoid.default)
def _sigmoid(out: torch.Tensor, x: Node) -> Node:
    x = _cast(x, out.dtype)
    return prim("reciprocal", prim("add", prim("exp", prim("neg", x)), 1.0))


@implements(aten.relu.default)
def _relu(out: torch.Tensor, x: Node) -> Node:
    return prim("where", prim("le", x, 0), 0, x)


@implements(aten.frac.default)
def _frac(out: torch.Tensor, x: Node) -> Node:
    return prim("sub", x, prim("trunc", x))


_BINARY = {
    "mul": "mul",
    "maximum": "maximum",
    "minimum": "minimum",
    "atan2": "atan2",
    "hypot": "hypot",
    "copysign": "copysign",
    "remainder": "remainder",
    "fmod": "fmod",
    "eq": "eq",
    "ne": "ne",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "logical_and": "logical_and",
    "logical_or": "logical_or",
    "logical_xor": "logical_xor",
    "bitwise_and": "bitwise_and",
    "bitwise_or": "bitwise_or",
    "bitwise_xor": "bitwise_xor",
    "bitwise_left_shift": "bitwise_left_shift",
    "bitwise_right_shift": "bitwise_right_shift",
    "__lshift__": "bitwise_left_shift",
    "__rshift__": "bitwise_right_shift",
    "floor_divide": "floor_divide",
    "pow": "pow",
    "fmax": None,
    "fmin": None,
}
for _n, _p in _BINARY.items():
    if _p is None:
        continue
    for _ov in ("Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor"):
        _op = getattr(getattr(aten, _n), _ov, None)
        if _op is not None:
            implements(_op)(lambda out, a, b, _p=_p: prim(_p, a, b))


def _alpha(b: Any, alpha: Any) -> Any:
    if alpha is None or alpha == 1:
        return b
    if isinstance(b, Node):
        return prim("mul", b, alpha)
    return b * alpha


@implements(aten.add.Tensor, aten.add.Scalar)
def _add(out: torch.Tensor, a: Any, b: Any, alpha: Any = 1) -> Node:
    return prim("add", a, _alpha(b, alpha))


@implements(aten.sub.Tensor, aten.sub.Scalar)
def _sub(out: torch.Tensor, a: Any, b: Any, alpha: Any = 1) -> Node:
    return prim("sub", a, _alpha(b, alpha))


@implements(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(out: torch.Tensor, a: Any, b: Any, alpha: Any = 1) -> Node:
    return prim("sub", b, _alpha(a, alpha))


@implements(aten.div.Tensor, aten.div.Scalar)
def _div(out: torch.Tensor, a: Any, b: Any) -> Node:
    return prim("div", a, b)


@implements(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(out: torch.Tensor, a: Any, b: Any, rounding_mode: str | None = None) -> Node:
    op = {None: "div", "floor": "floor_divide", "trunc": "trunc_divide"}[rounding_mode]
    return prim(op, a, b)


@implements(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(out: torch.Tensor, cond: Node, a: Any, b: Any) -> Node:
    if isinstance(a, Node) and isinstance(b, Node):
        a, b = _cast(a, out.dtype), _cast(b, out.dtype)
    return prim("where", cond, a, b)


@implements(aten.clamp.default, aten.clamp.Tensor)
def _clamp(out: torch.Tensor, x: Node, min: Any = None, max: Any = None) -> Node:
    return prim("clamp", x, min, max)


implements(aten.clamp_min.default, aten.clamp_min.Tensor)(
    lambda out, x, m: prim("clamp", x, m, None)
)
implements(aten.clamp_max.default, aten.clamp_max.Tensor)(
    lambda out, x, m: prim("clamp", x, None, m)
)


@implements(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(out: torch.Tensor, x: Node, mask: Node, value: Any) -> Node:
    if isinstance(value, Node):
        value = _cast(value, out.dtype)
    elif not out.dtype.is_floating_point and out.dtype != torch.bool:
        value = int(value)
    elif out.dtype == torch.bool:
        value = bool(value)
    return (
        prim("where", mask, value, x)
        if isinstance(value, Node)
        else _where_scalar(out, mask, value, x)
    )


def _where_scalar(out: torch.Tensor, mask: Node, value: Any, x: Node) -> Node:
    fill = prim("full", shape=(), value=float(value), dtype=dtype_name(out.dtype))
    return prim("where", mask, fill, x)


# -- casts and copies ------------------------------------------------------------------------


@implements(aten._to_copy.default)
def _to_copy(out: torch.Tensor, x: Node, **kw: Any) -> Node:
    dev = kw.get("device")
    if dev is not None and torch.device(dev).type not in ("cpu", "meta"):
        from dpnode.sdk._remote.dispatch import private_error

        raise private_error(f"moving a remote tensor to {dev}", "")
    return _cast(x, out.dtype) if x.dtype != out.dtype else x


implements(aten.clone.default)(lambda out, x, **kw: x)
implements(aten._unsafe_view.default)(
    lambda out, x, size: prim("reshape", x, shape=tuple(out.shape))
)
implements(aten.expand_copy.default)(
    lambda out, x, *a, **k: prim("expand", x, shape=tuple(out.shape))
)
implements(aten.view_copy.default)(
    lambda out, x, *a, **k: prim("reshape", x, shape=tuple(out.shape))
)


@implements(aten.cat.default)
def _cat(out: torch.Tensor, tensors: Sequence[Node], dim: int = 0) -> Node:
    return prim("cat", *tensors, dim=dim)


@implements(aten.stack.default)
def _stack(out: torch.Tensor, tensors: Sequence[Node], dim: int = 0) -> Node:
    d = dim % out.dim()
    return prim("cat", *[prim("unsqueeze", t, dim=d) for t in tensors], dim=d)


@implements(aten.constant_pad_nd.default)
def _pad(out: torch.Tensor, x: Node, pad: Sequence[int], value: float = 0) -> Node:
    return prim("pad", x, pad=tuple(pad), value=float(value))


implements(aten.flip.default)(lambda out, x, dims: prim("flip", x, dims=tuple(dims)))
implements(aten.index_select.default)(
    lambda out, x, dim, idx: prim("index_select", x, idx, dim=dim)
)
implements(aten.gather.default)(
    lambda out, x, dim, idx, sparse_grad=False: prim("gather", x, idx, dim=dim)
)


@implements(aten.scatter.src, aten.scatter.value)
def _scatter(out: torch.Tensor, x: Node, dim: int, idx: Node, src: Any) -> Node:
    if not isinstance(src, Node) and not out.dtype.is_floating_point:
        src = int(src)
    return prim("scatter", x, idx, _cast(src, out.dtype), dim=dim)


implements(aten.scatter_add.default)(
    lambda out, x, dim, idx, src: prim("scatter_add", x, idx, src, dim=dim)
)


@implements(aten.index_put.default)
def _index_put(
    out: torch.Tensor, x: Node, indices: Sequence[Any], values: Node, accumulate: bool = False
) -> Node:
    from dpnode.sdk._remote.indexing import expand_index_values

    return expand_index_values(out, x, indices, values, accumulate)


# -- factories -----------------------------------------------------------------------------


def _full(out: torch.Tensor, value: Any) -> Node:
    if isinstance(value, Node):
        return prim("expand", _cast(value, out.dtype), shape=tuple(out.shape))
    if isinstance(value, float) and value != value:
        from dpnode.sdk._remote.graph import nan_node

        return nan_node(tuple(out.shape), dtype_name(out.dtype))
    return prim("full", shape=tuple(out.shape), value=float(value), dtype=dtype_name(out.dtype))


for _op, _v in (
    (aten.zeros.default, 0.0),
    (aten.ones.default, 1.0),
    (aten.empty.memory_format, 0.0),
    (aten.empty_strided.default, 0.0),
    (aten.zeros_like.default, 0.0),
    (aten.ones_like.default, 1.0),
    (aten.empty_like.default, 0.0),
    (aten.new_zeros.default, 0.0),
    (aten.new_ones.default, 1.0),
    (aten.new_empty.default, 0.0),
    (aten.new_empty_strided.default, 0.0),
):
    implements(_op)(lambda out, *a, _v=_v, **k: _full(out, _v))
    FACTORIES.add(_op)
implements(aten.full.default)(lambda out, size, value, **k: _full(out, value))
implements(aten.full_like.default)(lambda out, x, value, **k: _full(out, value))
implements(aten.new_full.default)(lambda out, x, size, value, **k: _full(out, value))
implements(aten.scalar_tensor.default)(lambda out, value, **k: _full(out, value))
implements(aten.fill.Scalar, aten.fill.Tensor)(lambda out, x, value: _full(out, value))
implements(aten.zero.default)(lambda out, x: _full(out, 0.0))
implements(aten.lift_fresh_copy.default)(lambda out, x: x)


@implements(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(out: torch.Tensor, *args: Any, **kw: Any) -> Node:
    nums = [a for a in args if isinstance(a, (int, float))]
    start, end, step = (
        (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) > 2 else 1)
    )
    return prim(
        "arange", start=float(start), end=float(end), step=float(step), dtype=dtype_name(out.dtype)
    )


@implements(aten.rand.default, aten.rand_like.default)
def _rand(out: torch.Tensor, *args: Any, **kw: Any) -> Node:
    if not out.dtype.is_floating_point:
        # an integer "uniform [0, 1)" (torch._refs.geometric asks for one): always 0
        r = prim("rand", shape=tuple(out.shape), dtype="float32")
        return prim("convert_element_type", r, dtype=dtype_name(out.dtype))
    return prim("rand", shape=tuple(out.shape), dtype=dtype_name(out.dtype))


@implements(aten.bernoulli.p)
def _bernoulli(out: torch.Tensor, x: Node, p: float = 0.5, generator: Any = None) -> Node:
    r = prim("rand", shape=tuple(out.shape), dtype="float32")
    return prim("convert_element_type", prim("lt", r, float(p)), dtype=dtype_name(out.dtype))


FACTORIES.update(
    {
        aten.full.default,
        aten.scalar_tensor.default,
        aten.arange.default,
        aten.arange.start,
        aten.arange.start_step,
        aten.rand.default,
    }
)

# -- data-dependent ops ----------------------------------------------------------------------

_WHERE = "Use torch.where(condition, a, b) to choose values remotely."
_UNIQUE = (
    "The distinct values are the data itself; their number publishes: "
    "sdk.count_distinct(x).publish(epsilon=...), or count_distinct(column) in ds.query()."
)
for _op, _what, _advice in (
    (aten._local_scalar_dense.default, "tensor.item()", _WHERE),
    (aten.nonzero.default, "torch.nonzero (positions of nonzero values)", _WHERE),
    (
        aten.masked_select.default,
        "boolean masking (a data-dependent shape)",
        _WHERE + " Or multiply by the mask and sum.",
    ),
    (aten._unique2.default, "torch.unique", _UNIQUE),
    (aten.unique_dim.default, "torch.unique", _UNIQUE),
    (aten.unique_consecutive.default, "torch.unique_consecutive", _UNIQUE),
    (aten.equal.default, "torch.equal (a Python bool)", "Compare remotely: (a == b).all()."),
    (aten.is_nonzero.default, "bool(tensor)", _WHERE),
    (
        aten.repeat_interleave.Tensor,
        "repeat_interleave with remote counts",
        "The result shape would be private.",
    ),
    (
        aten.bincount.default,
        "torch.bincount",
        "Sum one-hot columns over public categories instead.",
    ),
    (aten._assert_async.default, "an assertion on a remote value", ""),
    (aten._assert_async.msg, "an assertion on a remote value", ""),
):
    PRIVATE[_op] = (_what, _advice)

PRIVATE[torch.ops.prims.item.default] = ("tensor.item()", _WHERE)
