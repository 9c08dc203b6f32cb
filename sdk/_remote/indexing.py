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
    bshape = tuple(torch.broadcast_shapes(*[tuple(indices[k].shape) for k in pos]))
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
        dims = list(range(nb, nb + first)) + list(range(nb)) + list(range(nb + first, nb + len(rest)))
        result = prim("permute", result, dims=tuple(dims))
    return _wrap(out, result, getattr(x, "_source", ""))


def expand_index_values(out: torch.Tensor, x: Node, indices: Sequence[Any], values: Node, accumulate: bool) -> Node:
    """``index_put`` with values cast to the input's dtype (the prim requires it)."""
    if isinstance(values, Node) and values.dtype is not None and values.dtype != out.dtype:
        from sdk._remote.rules import dtype_name

        values = prim("convert_element_type", values, dtype=dtype_name(out.dtype))
    idx = [None if i is None else i for i in indices]
    for i in idx:
        if isinstance(i, Node) and i.dtype in (torch.bool, torch.uint8) and i.op != "constant":
            raise private_error("index_put with a remote boolean mask", "Use torch.where(mask, values, x).")
    conv = []
    for i in idx:
        if isinstance(i, Node) and i.op == "constant" and i.dtype in (torch.bool, torch.uint8):
            assert i.value is not None
            for t in torch.from_numpy(i.value.copy()).bool().nonzero().unbind(1):
                conv.append(node_of(t))
        else:
            conv.append(i)
    return prim("index_put", x, values, *conv, accumulate=bool(accumulate))


SPECIAL[aten.index.Tensor] = lambda args, kwargs: index(*args, **kwargs)
