"""Advanced indexing (``x[idx]``, ``x[idx] = v``) on remote tensors.

``aten.index.Tensor`` has no prim of its own: integer index tensors are
combined into one linear index over the indexed dims, which ``index_select``
then reads from a reshaped input; the result is permuted where torch puts the
broadcast index dims. Boolean masks are turned into integer indices *locally*
when the mask is a public (local) tensor, whose positions are public anyway; a
remote mask has a data-dependent result shape and raises PrivateValueError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from sdk._exceptions import UnsupportedOperationError
from sdk._remote.dispatch import SPECIAL, node_of, private_error
from sdk._remote.graph import Node, prim
from sdk._remote.tensor import RemoteTensor

__all__ = ["expand_index_values", "index"]

aten = torch.ops.aten


def _mask_to_indices(indices: Sequence[Any]) -> list[Any]:
    """Local boolean masks become their nonzero positions (one index per masked dim)."""
    out: list[Any] = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
            if isinstance(i, RemoteTensor):
                raise private_error(
                    "indexing with a remote boolean mask",
                    "The number of selected elements depends on the data; use "
                    "torch.where(mask, x, 0) or (x * mask).sum() instead.",
                )
            out.extend(i.nonzero().unbind(1))
        else:
            out.append(i)
    return out


def index(x: Any, indices: Sequence[Any]) -> Any:
    """``aten.index.Tensor`` on a remote ``x`` (or remote indices)."""
    from sdk._remote.dispatch import _meta, _wrap

    indices = _mask_to_indices(indices)
    out = aten.index.Tensor(_meta(x), [None if i is None else _meta(i) for i in indices])
    xs = tuple(x.shape)
    nd = len(xs)
    pos = [k for k, i in enumerate(indices) if i is not None]
    xn = node_of(x)
    idx_nodes = [node_of(indices[k]) for k in pos]
    bshape = tuple(torch.broadcast_shapes(*[tuple(indices[k].shape) for k in pos]))  # type: ignore[no-untyped-call]
    # move the indexed dims to the front, flatten them
    rest = [d for d in range(nd) if d not in pos]
    perm = pos + rest
    moved = prim("permute", xn, dims=tuple(perm)) if perm != list(range(nd)) else xn
    sizes = [xs[k] for k in pos]
    rest_shape = tuple(xs[d] for d in rest)
    flat = prim("reshape", moved, shape=(math.prod(sizes), *rest_shape))
    linear: Any = None
    stride = 1
    for k, node in reversed(list(zip(pos, idx_nodes, strict=True))):
        n = xs[k]
        term = prim("remainder", node, n)  # torch accepts negative indices
        if stride != 1:
            term = prim("mul", term, stride)
        linear = term if linear is None else prim("add", term, linear)
        stride *= n
    if tuple(bshape) != tuple(indices[pos[0]].shape) or len(pos) > 1:
        linear = prim("expand", linear, shape=bshape)
    linear = prim("convert_element_type", linear, dtype="int64")
    picked = prim("index_select", flat, prim("reshape", linear, shape=(math.prod(bshape),)), dim=0)
    result = prim("reshape", picked, shape=bshape + rest_shape)
    adjacent = pos == list(range(pos[0], pos[0] + len(pos)))
    if adjacent and pos[0] > 0:
        # torch keeps the index dims in place when the indexed dims are adjacent
        nb, first = len(bshape), pos[0]
        dims = (
            list(range(nb, nb + first)) + list(range(nb)) + list(range(nb + first, nb + len(rest)))
        )
        result = prim("permute", result, dims=tuple(dims))
    return _wrap(out, result, getattr(x, "_source", ""))


def _masked_put(out: torch.Tensor, x: Node, idx: list[Any], values: Node, accumulate: bool) -> Node:
    """``x[mask] = v`` with a remote mask (its count is private, the result's shape is not).

    Values that do not vary along the selected positions (one value, or one per trailing
    dim) are a ``where``; values with one row per True take the k-th row at the k-th True
    (a cumsum rank, as masked_scatter), and more Trues than rows is an index error on the node.
    """
    if len(idx) != 1:
        raise private_error(
            "x[mask] = values with a remote boolean mask among other indices",
            "Which value lands where depends on the data; use torch.where(mask, values, x).",
        )
    mask = idx[0]
    assert mask.shape is not None and x.shape is not None
    if mask.dtype != torch.bool:
        mask = prim("convert_element_type", mask, dtype="bool")
    mshape, xshape = tuple(mask.shape), tuple(x.shape)
    rest = xshape[len(mshape) :]
    vshape = tuple(values.shape or ())
    mask_b = prim("reshape", mask, shape=mshape + (1,) * len(rest)) if rest else mask
    if len(vshape) <= len(rest) or (len(vshape) == len(rest) + 1 and vshape[0] == 1):
        # the same value(s) at every selected position
        core = vshape[1:] if len(vshape) == len(rest) + 1 else vshape
        v = prim(
            "reshape", values, shape=(1,) * len(mshape) + (1,) * (len(rest) - len(core)) + core
        )
        new = prim("add", x, v) if accumulate else v
        return prim("where", mask_b, new, x)
    n = math.prod(mshape)
    width = math.prod(rest)
    rows = prim(
        "reshape", prim("expand", values, shape=(vshape[0], *rest)), shape=(vshape[0], width)
    )
    flat_mask = prim("reshape", mask, shape=(n,))
    rank = prim("clamp", prim("sub", prim("cumsum", flat_mask, dim=0, dtype="int64"), 1), 0, None)
    taken = prim("reshape", prim("index_select", rows, rank, dim=0), shape=xshape)
    new = prim("add", x, taken) if accumulate else taken
    return prim("where", mask_b, new, x)


def expand_index_values(
    out: torch.Tensor, x: Node, indices: Sequence[Any], values: Node, accumulate: bool
) -> Node:
    """``index_put`` with values cast to the input's dtype (the prim requires it)."""
    if isinstance(values, Node) and values.dtype is not None and values.dtype != out.dtype:
        from sdk._remote.rules import dtype_name

        values = prim("convert_element_type", values, dtype=dtype_name(out.dtype))
    idx = [None if i is None else i for i in indices]
    remote_masks = [
        k
        for k, i in enumerate(idx)
        if isinstance(i, Node) and i.dtype in (torch.bool, torch.uint8) and i.op != "constant"
    ]
    if remote_masks:
        return _masked_put(out, x, idx, values, accumulate)
    conv = []
    for i in idx:
        if isinstance(i, Node) and i.op == "constant" and i.dtype in (torch.bool, torch.uint8):
            assert i.value is not None
            for t in torch.from_numpy(i.value.copy()).bool().nonzero().unbind(1):
                conv.append(node_of(t))
        else:
            conv.append(i)  # type: ignore[arg-type]
    return prim("index_put", x, values, *conv, accumulate=bool(accumulate))


SPECIAL[aten.index.Tensor] = lambda args, kwargs: index(*args, **kwargs)


def as_strided(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten.as_strided``: a gather from the base's memory order at public positions.

    The positions depend only on sizes, strides and offsets (all public), so
    they travel as a constant index; the result is a view (writes scatter back).
    """
    from sdk._remote.dispatch import _meta
    from sdk._remote.graph import constant

    x, size, stride = args[0], tuple(args[1]), tuple(args[2])
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    out = aten.as_strided.default(_meta(x), size, stride, offset)
    if not isinstance(x, RemoteTensor):
        return aten.as_strided.default(x, size, stride, offset)
    base = x._storage.meta
    if base is None:
        raise UnsupportedOperationError("as_strided on a tensor whose memory layout is unknown")
    order = sorted(range(base.dim()), key=lambda d: (-base.stride(d), d))  # type: ignore[operator]
    pshape = tuple(base.shape[d] for d in order)
    dense = base.storage_offset() == 0 and [base.stride(d) for d in order] == list(
        torch.empty(pshape, device="meta").stride()
    )
    if not dense:
        raise UnsupportedOperationError(
            "as_strided on a tensor that is not dense in memory; call .contiguous() first"
        )
    start = out.storage_offset()
    pos = torch.full((), start, dtype=torch.int64)
    for k, (n, st) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[k] = n
        pos = pos + (torch.arange(n, dtype=torch.int64) * st).reshape(shape)
    flat = pos.expand(size).reshape(-1).contiguous()
    if flat.numel() and int(flat.max()) >= base.numel():
        raise UnsupportedOperationError(
            "as_strided reaching outside the tensor's own elements (a remote tensor has no "
            "surrounding buffer)"
        )
    idx = constant(flat)
    step = ("strided", size, idx, tuple(order), pshape)
    r = RemoteTensor(out, x._storage, (step,), x._source)
    node = x._storage.node
    from sdk._remote.views import forward

    value = forward(step, node)
    value.shape, value.dtype = size, out.dtype
    r._cached, r._seen_version = value, x._storage.version
    return r


SPECIAL[aten.as_strided.default] = as_strided
