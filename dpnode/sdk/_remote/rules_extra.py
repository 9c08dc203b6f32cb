"""Rules built from several prims: order statistics, flat indexing, scatter reductions,
searchsorted, and writes of private values at public positions.

Everything here is exact (same values as torch) except where torch's own result is
unspecified (tie order of indices). What cannot be exact with earlier prims got a prim
of its own (scatter_reduce, cumargmax...). Random sampling lives in ``rules_random``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sdk._exceptions import UnsupportedOperationError
from sdk._remote.graph import Node, nan_node, prim
from sdk._remote.quantiles import selected_quantile
from sdk._remote.rules import dtype_name, implements

__all__: list[str] = []

aten = torch.ops.aten


def _flat(x: Node) -> Node:
    r = prim("reshape", x, shape=(-1,))
    r.shape, r.dtype = (_numel(x),), x.dtype
    return r


def _numel(x: Node) -> int:
    return math.prod(x.shape or ())


@implements(aten.take.default)
def _take(out: torch.Tensor, x: Node, index: Node) -> Node:
    i = _flat(prim("remainder", index, max(_numel(x), 1)))  # negative indices count from the end
    return prim("reshape", prim("index_select", _flat(x), i, dim=0), shape=tuple(out.shape))


@implements(aten.put.default)
def _put(out: torch.Tensor, x: Node, index: Node, source: Node, accumulate: bool = False) -> Node:
    i = _flat(prim("remainder", index, max(_numel(x), 1)))
    flat = prim("index_put", _flat(x), _flat(source), i, accumulate=bool(accumulate))
    return prim("reshape", flat, shape=tuple(out.shape))


def _nth(x: Node, k: int, dim: int, keepdim: bool) -> tuple[Node, Node]:
    """The k-th smallest along ``dim`` (NaN sorts last, as in torch) and its index."""
    nd = len(x.shape or ())
    if nd == 0:
        return x, prim("full", shape=(), value=0.0, dtype="int64")
    d = dim % nd
    order = prim("argsort", x, dim=d)
    idx = prim("slice", order, dim=d, start=k, end=k + 1, step=1)
    val = prim("gather", x, idx, dim=d)
    if not keepdim:
        val, idx = prim("squeeze", val, dims=(d,)), prim("squeeze", idx, dims=(d,))
    return val, idx


@implements(aten.kthvalue.default)
def _kthvalue(out: Any, x: Node, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Node, Node]:
    return _nth(x, k - 1, dim, keepdim)


def _nan_propagating(x: Node, val: Node, dims: tuple[int, ...] | None, keepdim: bool) -> Node:
    if x.dtype is None or not x.dtype.is_floating_point:
        return val
    has_nan = prim("any", prim("isnan", x), dims=dims, keepdim=keepdim)
    return prim("where", has_nan, nan_node((), dtype_name(x.dtype)), val)


@implements(aten.median.default)
def _median(out: torch.Tensor, x: Node) -> Node:
    n = _numel(x)
    if n == 0:
        raise UnsupportedOperationError("median of an empty tensor")
    if x.private:  # selected on the node (sdk/_remote/quantiles.py)
        return selected_quantile(x, torch.tensor(0.5, dtype=torch.float64), "lower", False)
    val, _ = _nth(_flat(x), (n - 1) // 2, 0, False)
    return _nan_propagating(x, val, None, False)


@implements(aten.median.dim)
def _median_dim(out: Any, x: Node, dim: int, keepdim: bool = False) -> tuple[Node, Node]:
    shape = x.shape or ()
    n = shape[dim % len(shape)] if shape else 1
    val, idx = _nth(x, (n - 1) // 2, dim, keepdim)
    if shape:
        val = _nan_propagating(x, val, (dim % len(shape),), keepdim)
    return val, idx


@implements(aten.scatter_reduce.two)
def _scatter_reduce(
    out: torch.Tensor,
    x: Node,
    dim: int,
    index: Node,
    src: Node,
    reduce: str,
    *,
    include_self: bool = True,
) -> Node:
    return prim("scatter_reduce", x, index, src, dim=dim, reduce=reduce, include_self=include_self)


_LEGACY_REDUCE = {"add": "sum", "multiply": "prod"}


@implements(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_legacy(
    out: torch.Tensor, x: Node, dim: int, index: Node, src: Any, *, reduce: str
) -> Node:
    if not isinstance(src, Node):  # a scalar: one value per index entry
        src = prim("full", shape=tuple(index.shape or ()), value=float(src), dtype=_name(out))
    return prim("scatter_reduce", x, index, src, dim=dim, reduce=_LEGACY_REDUCE[reduce])


@implements(aten.index_reduce.default)
def _index_reduce(
    out: torch.Tensor,
    x: Node,
    dim: int,
    index: Node,
    source: Node,
    reduce: str,
    *,
    include_self: bool = True,
) -> Node:
    # index_reduce is scatter_reduce with the 1-d index spread over source's other dims
    shape = tuple(source.shape or ())
    if shape:
        d = dim % len(shape)
        lifted = [1] * len(shape)
        lifted[d] = shape[d]
        index = prim("expand", prim("reshape", index, shape=tuple(lifted)), shape=shape)
    return prim(
        "scatter_reduce", x, index, source, dim=dim, reduce=reduce, include_self=include_self
    )


def _name(out: torch.Tensor) -> str:
    return dtype_name(out.dtype)


def _cum_extreme(which: str) -> Any:
    def rule(out: Any, x: Node, dim: int) -> tuple[Node, Node]:
        if not x.shape:
            return x, prim("full", shape=(), value=0.0, dtype="int64")
        idx = prim(which, x, dim=dim)
        return prim("gather", x, idx, dim=dim), idx

    return rule


implements(aten.cummax.default)(_cum_extreme("cumargmax"))
implements(aten.cummin.default)(_cum_extreme("cumargmin"))
implements(aten.logcumsumexp.default)(lambda out, x, dim: prim("logcumsumexp", x, dim=dim))


@implements(aten.nanmedian.default)
def _nanmedian(out: torch.Tensor, x: Node) -> Node:
    if not x.shape:
        return x
    if x.private:
        return selected_quantile(x, torch.tensor(0.5, dtype=torch.float64), "lower", True)
    val, _ = _nan_skipping_median(_flat(x), 0, False)
    return val


@implements(aten.nanmedian.dim)
def _nanmedian_dim(out: Any, x: Node, dim: int = -1, keepdim: bool = False) -> tuple[Node, Node]:
    if not x.shape:
        return x, prim("full", shape=(), value=0.0, dtype="int64")
    return _nan_skipping_median(x, dim % len(x.shape), keepdim)


def _nan_skipping_median(x: Node, d: int, keepdim: bool) -> tuple[Node, Node]:
    """The lower median of the non-NaN values along ``d`` (all NaN: NaN), and its index.

    NaN sorts last, so the median of the k non-NaN values sits at rank (k - 1) // 2.
    """
    order = prim("argsort", x, dim=d)
    valid = prim("sum", prim("logical_not", prim("isnan", x)), dims=(d,), keepdim=True)
    rank = prim("clamp", prim("floor_divide", prim("sub", valid, 1), 2), 0, None)
    idx = prim("gather", order, rank, dim=d)
    val = prim("gather", x, idx, dim=d)
    if not keepdim:
        val, idx = prim("squeeze", val, dims=(d,)), prim("squeeze", idx, dims=(d,))
    return val, idx


@implements(aten._trilinear.default)
def _trilinear(
    out: torch.Tensor,
    i1: Node,
    i2: Node,
    i3: Node,
    expand1: list[int],
    expand2: list[int],
    expand3: list[int],
    sumdim: list[int],
    unroll_dim: int = 1,
) -> Node:
    # torch's definition: unsqueeze each input at its expand dims, multiply, sum over sumdim
    def lift(t: Node, dims: list[int]) -> Node:
        for d in sorted(dims):
            t = prim("unsqueeze", t, dim=d)
        return t

    prod = prim("mul", prim("mul", lift(i1, expand1), lift(i2, expand2)), lift(i3, expand3))
    if not sumdim:
        return prod
    return prim("sum", prod, dims=tuple(sumdim), keepdim=False, dtype=dtype_name(out.dtype))


@implements(aten.addbmm.default)
def _addbmm(
    out: torch.Tensor, x: Node, b1: Node, b2: Node, *, beta: Any = 1, alpha: Any = 1
) -> Node:
    if not out.dtype.is_floating_point:  # torch casts the scalars to the integer dtype
        alpha, beta = int(alpha), int(beta)
    prod = prim(
        "sum", prim("matmul", b1, b2), dims=(0,), keepdim=False, dtype=dtype_name(out.dtype)
    )
    if alpha != 1:
        prod = prim("mul", prod, alpha)
    r = prod if beta == 0 else prim("add", prim("mul", x, beta) if beta != 1 else x, prod)
    return prim("convert_element_type", r, dtype=dtype_name(out.dtype))


@implements(aten.angle.default)
def _angle(out: torch.Tensor, x: Node) -> Node:
    # real input: pi for negatives, 0 otherwise, NaN stays NaN
    if x.dtype is not None and x.dtype != out.dtype:
        x = prim("convert_element_type", x, dtype=dtype_name(out.dtype))
    ang = prim("where", prim("lt", x, 0), math.pi, 0.0)
    return prim("where", prim("isnan", x), x, ang)


def _searchsorted(
    out: torch.Tensor,
    seq: Node,
    values: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Node | None = None,
) -> Node:
    if side is not None:
        right = side == "right"
    if sorter is not None:
        seq = prim("gather", seq, sorter, dim=-1)
    return _placed(seq, values, bool(right), bool(out_int32))


implements(aten.searchsorted.Tensor, aten.searchsorted.Scalar)(_searchsorted)


@implements(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(
    out: torch.Tensor, x: Any, boundaries: Node, *, out_int32: bool = False, right: bool = False
) -> Node:
    return _placed(boundaries, x, bool(right), bool(out_int32))


def _placed(seq: Node, values: Any, right: bool, out_int32: bool) -> Node:
    """Where ``values`` fall among the sorted ``seq``: for one sorted row and a tensor of
    values, the number of its entries below each value (at or below with ``right``), by
    comparisons, which have privacy rules on private values (``searchsorted`` has none). As
    torch's binary search, a NaN value counts every entry (``!(entry >= NaN)`` holds)."""
    if not isinstance(values, Node) or len(seq.shape or ()) != 1:
        return prim("searchsorted", seq, values, right=right, out_int32=out_int32)
    beyond = prim("gt" if right else "ge", seq, prim("unsqueeze", values, dim=-1))
    below = prim("logical_not", beyond)
    return prim("sum", below, dims=(-1,), dtype="int32" if out_int32 else "int64")


@implements(aten.masked_scatter.default)
def _masked_scatter(out: torch.Tensor, x: Node, mask: Node, source: Node) -> Node:
    # the k-th True of the (broadcast) mask, in row-major order, takes source's k-th value;
    # more Trues than source values is an index out of range on the node, as torch refuses
    shape = tuple(out.shape)
    n = math.prod(shape)
    if _numel(source) == 0 or n == 0:
        return prim("convert_element_type", x, dtype=dtype_name(out.dtype))
    m = prim("reshape", prim("expand", mask, shape=shape), shape=(n,))
    rank = prim("sub", prim("cumsum", m, dim=0, dtype="int64"), 1)
    rank = prim("clamp", rank, 0, None)
    taken = prim("index_select", _flat(source), rank, dim=0)
    return prim("where", prim("reshape", m, shape=shape), prim("reshape", taken, shape=shape), x)


@implements(aten.nonzero_static.default)
def _nonzero_static(out: torch.Tensor, x: Node, *, size: int, fill_value: int = -1) -> Node:
    # the shape is public (size rows), the positions are private values like any other:
    # the k-th nonzero element writes its (public) coordinates into row k, rows past the
    # count keep fill_value, and elements past ``size`` land in a discarded extra row
    shape = tuple(x.shape or ())
    nd, n = len(shape), _numel(x)
    if nd == 0 or n == 0 or size == 0:
        return prim("full", shape=tuple(out.shape), value=float(fill_value), dtype="int64")
    from sdk._remote.graph import constant

    coords = torch.stack(torch.unravel_index(torch.arange(n), shape), dim=1)
    nz = prim("ne", _flat(x), 0)
    rank = prim("sub", prim("cumsum", nz, dim=0, dtype="int64"), 1)
    row = prim("where", prim("logical_and", nz, prim("lt", rank, size)), rank, size)
    index = prim("expand", prim("unsqueeze", row, dim=1), shape=(n, nd))
    buf = prim("full", shape=(size + 1, nd), value=float(fill_value), dtype="int64")
    filled = prim("scatter", buf, index, constant(coords), dim=0)
    return prim("slice", filled, dim=0, start=0, end=size, step=1)


@implements(aten.diagonal_scatter.default)
def _diagonal_scatter(
    out: torch.Tensor, x: Node, src: Node, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> Node:
    # move dim1, dim2 last, write src at the public diagonal positions, move them back
    shape = tuple(x.shape or ())
    nd = len(shape)
    d1, d2 = dim1 % nd, dim2 % nd
    perm = [d for d in range(nd) if d not in (d1, d2)] + [d1, d2]
    back = [perm.index(d) for d in range(nd)]
    a, b = shape[d1], shape[d2]
    length = max(0, min(a + min(offset, 0), b - max(offset, 0)))
    if length == 0:
        return x
    from sdk._remote.graph import constant

    rows = constant(torch.arange(length) + max(-offset, 0))
    cols = constant(torch.arange(length) + max(offset, 0))
    y = prim("permute", x, dims=tuple(perm))
    y = prim("index_put", y, src, *([None] * (nd - 2)), rows, cols)
    return prim("permute", y, dims=tuple(back))


@implements(aten.as_strided_scatter.default)
def _as_strided_scatter(
    out: torch.Tensor,
    x: Node,
    src: Node,
    size: list[int],
    stride: list[int],
    storage_offset: int | None = None,
) -> Node:
    # the strided view's elements are public positions of the (contiguous) flattened input
    from sdk._remote.graph import constant

    n = _numel(x)
    pos = torch.full(tuple(size), int(storage_offset or 0), dtype=torch.int64)
    for d, (sz, st) in enumerate(zip(size, stride, strict=True)):
        step = torch.arange(sz, dtype=torch.int64) * st
        pos = pos + step.reshape([-1 if k == d else 1 for k in range(len(size))])
    if pos.numel() == 0:
        return x
    if int(pos.min()) < 0 or int(pos.max()) >= n:
        raise UnsupportedOperationError("as_strided_scatter outside the input's own elements")
    flat = prim("index_put", _flat(x), _flat(src), constant(pos.reshape(-1)))
    return prim("reshape", flat, shape=tuple(out.shape))
