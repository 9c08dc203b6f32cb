"""View ops: how each ATen view maps to prims, forwards and backwards.

A view is a list of elementary steps (reshape, permute, slice, select,
squeeze, unsqueeze, expand, identity). Each step has a forward rule (the view's
value from its base's) and an inverse (the base's new value after the view is
written), so mutation through views can be recorded with functional prims
only. Steps are plain tuples: they are created on every view op and must be
cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from sdk._exceptions import UnsupportedOperationError
from sdk._remote.graph import Node, constant, prim

__all__ = ["VIEW_SPECS", "Step", "forward", "inverse"]

aten = torch.ops.aten

#: ("reshape", out_shape, in_shape) | ("permute", dims) | ("slice", dim, start, end, step)
#: | ("select", dim, index) | ("squeeze", dims, in_shape) | ("unsqueeze", dim)
#: | ("expand", shape) | ("identity",)
Step = tuple[Any, ...]


def forward(step: Step, x: Node) -> Node:
    """The view's node from its base's."""
    kind = step[0]
    if kind == "identity":
        return x
    if kind == "reshape":
        return prim("reshape", x, shape=step[1])
    if kind == "permute":
        return prim("permute", x, dims=step[1])
    if kind == "slice":
        _, dim, start, end, st = step
        return prim("slice", x, dim=dim, start=start, end=end, step=st)
    if kind == "select":
        _, dim, index = step
        return prim(
            "squeeze", prim("slice", x, dim=dim, start=index, end=index + 1, step=1), dims=(dim,)
        )
    if kind == "squeeze":
        return prim("squeeze", x, dims=step[1])
    if kind == "unsqueeze":
        return prim("unsqueeze", x, dim=step[1])
    if kind == "expand":
        return prim("expand", x, shape=step[1])
    if kind == "strided":
        _, size, idx, perm, _pshape = step
        return prim("reshape", prim("index_select", _storage_flat(x, perm), idx, dim=0), shape=size)
    raise AssertionError(kind)


def _storage_flat(base: Node, perm: tuple[int, ...]) -> Node:
    """The base's values in memory order (its dims permuted by decreasing stride), flattened."""
    if perm != tuple(range(len(perm))):
        base = prim("permute", base, dims=perm)
    return prim("reshape", base, shape=(-1,))


def _scatter_slice(base: Node, value: Node, dim: int, start: int, end: int, step: int) -> Node:
    """``base[..., start:end:step, ...] = value`` along ``dim`` (``end`` clipped to the size).

    Recorded with ``slice``, ``cat`` and ``index_select`` at public positions, which have
    privacy rules, so that writing through a view of private data stays publishable.
    """
    k = len(range(start, end, step))
    if k == 0:
        return base
    last = start + (k - 1) * step + 1  # one past the last written position
    middle = value
    if step > 1:  # the written span interleaves value with the base's own elements
        span = last - start
        idx = [span + i // step if i % step == 0 else i for i in range(span)]
        both = prim(
            "cat", prim("slice", base, dim=dim, start=start, end=last, step=1), value, dim=dim
        )
        middle = prim("index_select", both, constant(torch.tensor(idx, dtype=torch.int64)), dim=dim)
    pieces = [middle, prim("slice", base, dim=dim, start=last, end=None, step=1)]
    if start > 0:
        pieces.insert(0, prim("slice", base, dim=dim, start=0, end=start, step=1))
    return prim("cat", *pieces, dim=dim)


def inverse(step: Step, base: Node, value: Node) -> Node:
    """The base's node after its view (``step`` applied to ``base``) is replaced by ``value``."""
    kind = step[0]
    if kind == "identity":
        return value
    if kind == "reshape":
        return prim("reshape", value, shape=step[2])
    if kind == "permute":
        dims = step[1]
        inv = tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
        return prim("permute", value, dims=inv)
    if kind == "slice":
        _, dim, start, end, st = step
        return _scatter_slice(base, value, dim, start, end, st)
    if kind == "select":
        _, dim, index = step
        return _scatter_slice(base, prim("unsqueeze", value, dim=dim), dim, index, index + 1, 1)
    if kind == "squeeze":
        return prim("reshape", value, shape=step[2])
    if kind == "unsqueeze":
        return prim("squeeze", value, dims=(step[1],))
    if kind == "strided":
        _, _, idx, perm, pshape = step
        flat = prim(
            "index_put", _storage_flat(base, perm), prim("reshape", value, shape=(-1,)), idx
        )
        back = prim("reshape", flat, shape=pshape)
        if perm != tuple(range(len(perm))):
            back = prim(
                "permute", back, dims=tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
            )
        return back
    if kind == "expand":
        raise UnsupportedOperationError(
            "writing into an expanded tensor (several elements share one memory location); "
            "torch refuses most such writes too: clone() it first"
        )
    raise AssertionError(kind)


# -- ATen view op -> steps ------------------------------------------------------------------

Spec = Callable[..., list[Step]]
VIEW_SPECS: dict[Any, Spec] = {}


def _views(*ops: Any) -> Callable[[Spec], Spec]:
    def deco(fn: Spec) -> Spec:
        for op in ops:
            VIEW_SPECS[op] = fn
        return fn

    return deco


def _dim(d: int, n: int) -> int:
    return d % max(n, 1)


@_views(aten.view.default, aten._reshape_alias.default, aten.reshape.default, aten.view.dtype)
def _view(x: torch.Tensor, out: torch.Tensor, *args: Any, **kw: Any) -> list[Step]:
    if out.dtype != x.dtype:
        raise UnsupportedOperationError(
            "aten.view.dtype (reinterpreting bits) is not in the prim vocabulary"
        )
    if tuple(out.shape) == tuple(x.shape):
        return [("identity",)]
    return [("reshape", tuple(out.shape), tuple(x.shape))]


@_views(aten.alias.default, aten.detach.default, aten.lift_fresh.default, aten.view_as.default)
def _identity(x: torch.Tensor, out: torch.Tensor, *args: Any, **kw: Any) -> list[Step]:
    return [("identity",)]


@_views(aten.t.default)
def _t(x: torch.Tensor, out: torch.Tensor) -> list[Step]:
    return [("permute", (1, 0))] if x.dim() == 2 else [("identity",)]


@_views(aten.transpose.int)
def _transpose(x: torch.Tensor, out: torch.Tensor, d0: int, d1: int) -> list[Step]:
    n = x.dim()
    if n < 2:
        return [("identity",)]
    dims = list(range(n))
    a, b = _dim(d0, n), _dim(d1, n)
    dims[a], dims[b] = dims[b], dims[a]
    return [("permute", tuple(dims))]


@_views(aten.permute.default)
def _permute(x: torch.Tensor, out: torch.Tensor, dims: Sequence[int]) -> list[Step]:
    n = x.dim()
    return [("permute", tuple(_dim(d, n) for d in dims))] if n else [("identity",)]


@_views(aten.expand.default)
def _expand(x: torch.Tensor, out: torch.Tensor, *args: Any, **kw: Any) -> list[Step]:
    if tuple(out.shape) == tuple(x.shape):
        return [("identity",)]
    return [("expand", tuple(out.shape))]


@_views(aten.slice.Tensor)
def _slice(
    x: torch.Tensor,
    out: torch.Tensor,
    dim: int = 0,
    start: Any = None,
    end: Any = None,
    step: int = 1,
) -> list[Step]:
    d = _dim(dim, x.dim())
    s, e, st = slice(start, end, step).indices(x.shape[d])
    if (s, st) == (0, 1) and e >= x.shape[d]:
        return [("identity",)]
    e = max(e, s)
    return [("slice", d, s, e, st)]


@_views(aten.select.int)
def _select(x: torch.Tensor, out: torch.Tensor, dim: int, index: int) -> list[Step]:
    d = _dim(dim, x.dim())
    return [("select", d, index % x.shape[d])]


@_views(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(x: torch.Tensor, out: torch.Tensor, dim: Any = None) -> list[Step]:
    if tuple(out.shape) == tuple(x.shape):
        return [("identity",)]
    n = x.dim()
    dims = range(n) if dim is None else ([dim] if isinstance(dim, int) else dim)
    keep = tuple(_dim(d, n) for d in dims if x.shape[_dim(d, n)] == 1)
    return [("squeeze", keep, tuple(x.shape))]


@_views(aten.unsqueeze.default)
def _unsqueeze(x: torch.Tensor, out: torch.Tensor, dim: int) -> list[Step]:
    return [("unsqueeze", dim % (x.dim() + 1))]


def multi_view_steps(
    func: Any, x: torch.Tensor, outs: Sequence[torch.Tensor], args: Sequence[Any]
) -> list[list[Step]]:
    """Steps for each output of a multi-output view (split, split_with_sizes, unbind)."""
    if func is aten.unbind.int:
        d = _dim(args[0] if args else 0, x.dim())
        return [[("select", d, i)] for i in range(len(outs))]
    d = _dim(args[1] if len(args) > 1 else 0, x.dim())
    steps: list[list[Step]] = []
    pos = 0
    for o in outs:
        n = o.shape[d]
        steps.append([("slice", d, pos, pos + n, 1)])
        pos += n
    return steps


MULTI_VIEWS = {aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int}
