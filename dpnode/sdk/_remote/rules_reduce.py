"""Reductions, order statistics and variance, and the torch._prims ops decompositions emit.

Same conventions as ``rules.py``: a rule gets the meta output and the
arguments with tensors as nodes, and returns one node per output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from sdk._remote.dispatch import RULES
from sdk._remote.graph import Node, prim
from sdk._remote.rules import _cast, dims_of, dtype_name, implements

__all__: list[str] = []

aten = torch.ops.aten
Rule = Callable[..., Any]


# -- reductions ----------------------------------------------------------------------------


@implements(aten.sum.default, aten.sum.dim_IntList)
def _sum(
    out: torch.Tensor, x: Node, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> Node:
    return prim(
        "sum",
        x,
        dims=dims_of(dim, len(x.shape or ())),
        keepdim=keepdim,
        dtype=dtype_name(out.dtype),
    )


@implements(aten.prod.default, aten.prod.dim_int)
def _prod(
    out: torch.Tensor, x: Node, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> Node:
    return prim(
        "prod",
        x,
        dims=dims_of(dim, len(x.shape or ())),
        keepdim=keepdim,
        dtype=dtype_name(out.dtype),
    )


@implements(aten.mean.default, aten.mean.dim)
def _mean(
    out: torch.Tensor, x: Node, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> Node:
    return prim("mean", _cast(x, out.dtype), dims=dims_of(dim, len(x.shape or ())), keepdim=keepdim)


def _reduce(name: str) -> Rule:
    def rule(out: torch.Tensor, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
        return prim(name, x, dims=dims_of(dim, len(x.shape or ())), keepdim=keepdim)

    return rule


for _n in ("amax", "amin", "any", "all"):
    implements(getattr(aten, _n))(_reduce(_n))
implements(aten.max.default)(lambda out, x: prim("amax", x))
implements(aten.min.default)(lambda out, x: prim("amin", x))
implements(aten.max.other)(lambda out, a, b: prim("maximum", a, b))
implements(aten.min.other)(lambda out, a, b: prim("minimum", a, b))


def _extreme_dim(kind: str) -> Rule:
    def rule(out: Any, x: Node, dim: int, keepdim: bool = False) -> tuple[Node, Node]:
        arg = prim("argmax" if kind == "max" else "argmin", x, dim=dim, keepdim=True)
        nd = len(x.shape or ())
        vals = prim("gather", x, arg, dim=dim) if nd else x
        if not keepdim and nd:
            vals = prim("squeeze", vals, dims=(dim % nd,))
            arg = prim("squeeze", arg, dims=(dim % nd,))
        return vals, arg

    return rule


implements(aten.max.dim)(_extreme_dim("max"))
implements(aten.min.dim)(_extreme_dim("min"))
implements(aten.argmax.default)(
    lambda out, x, dim=None, keepdim=False: prim("argmax", x, dim=dim, keepdim=keepdim)
)
implements(aten.argmin.default)(
    lambda out, x, dim=None, keepdim=False: prim("argmin", x, dim=dim, keepdim=keepdim)
)
implements(aten.cumsum.default)(
    lambda out, x, dim, dtype=None: prim("cumsum", x, dim=dim, dtype=dtype_name(out.dtype))
)


@implements(aten.sort.default, aten.sort.stable)
def _sort(out: Any, x: Node, *args: Any, **kw: Any) -> tuple[Node, Node]:
    stable = kw.pop("stable", None)
    del stable
    dim = kw.get("dim", args[0] if args and not isinstance(args[0], bool) else -1)
    descending = kw.get(
        "descending",
        args[1] if len(args) > 1 else (args[0] if args and isinstance(args[0], bool) else False),
    )
    idx = prim("argsort", x, dim=dim, descending=bool(descending))
    return (prim("gather", x, idx, dim=dim) if x.shape else x), idx


@implements(aten.topk.default)
def _topk(
    out: Any, x: Node, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[Node, Node]:
    idx = prim("topk", x, k=k, dim=dim, largest=largest)
    return (prim("gather", x, idx, dim=dim) if x.shape else x), idx


@implements(aten.var.correction, aten.var.dim, aten.var.default)
def _var(out: torch.Tensor, x: Node, dim: Any = None, *args: Any, **kw: Any) -> Node:
    correction = kw.get("correction")
    unbiased = kw.get("unbiased", args[0] if args and isinstance(args[0], bool) else True)
    keepdim = kw.get("keepdim", args[1] if len(args) > 1 else False)
    if isinstance(dim, bool):  # var.default(x, unbiased)
        unbiased, dim = dim, None
    if correction is None:
        correction = 1 if unbiased else 0
    shape = x.shape or ()
    dims = dims_of(dim, len(shape))
    reduced = range(len(shape)) if dims is None else dims
    n = 1
    for d in reduced:
        n *= shape[d]
    centred = prim("sub", x, prim("mean", x, dims=dims, keepdim=True))
    total = prim(
        "sum",
        prim("mul", centred, centred),
        dims=dims,
        keepdim=bool(keepdim),
        dtype=dtype_name(out.dtype),
    )
    return prim("div", total, float(max(n - correction, 0)))


# -- torch._prims ops that some decompositions emit directly -------------------------------

prims = torch.ops.prims


@implements(prims.var.default)
def _prims_var(
    out: torch.Tensor, x: Node, dims: Any, correction: float = 1.0, *, output_dtype: Any = None
) -> Node:
    shape = x.shape or ()
    d = dims_of(dims, len(shape))
    n = 1
    for k in range(len(shape)) if d is None else d:
        n *= shape[k]
    centred = prim("sub", x, prim("mean", x, dims=d, keepdim=True))
    total = prim(
        "sum", prim("mul", centred, centred), dims=d, keepdim=False, dtype=dtype_name(out.dtype)
    )
    return prim("div", total, float(max(n - correction, 0)))


@implements(prims.prod.default)
def _prims_prod(out: torch.Tensor, x: Node, dims: Any, *, output_dtype: Any = None) -> Node:
    return prim(
        "prod",
        x,
        dims=dims_of(dims, len(x.shape or ())),
        keepdim=False,
        dtype=dtype_name(out.dtype),
    )


def _fminmax(name: str) -> Rule:
    # fmax/fmin ignore NaN: take the other operand where one is NaN
    def rule(out: torch.Tensor, a: Any, b: Any) -> Node:
        m = prim(name, a, b)
        if not out.dtype.is_floating_point:
            return m
        return prim("where", prim("isnan", a), b, prim("where", prim("isnan", b), a, m))

    return rule


implements(prims.fmax.default, aten.fmax.default)(_fminmax("maximum"))
implements(prims.fmin.default, aten.fmin.default)(_fminmax("minimum"))
implements(prims.convert_element_type.default)(lambda out, x, dtype: _cast(x, out.dtype))


@implements(prims.broadcast_in_dim.default)
def _broadcast_in_dim(
    out: torch.Tensor, x: Node, shape: Sequence[int], broadcast_dims: Sequence[int]
) -> Node:
    src = list(x.shape or ())
    kept = [src[broadcast_dims.index(d)] if d in broadcast_dims else 1 for d in range(len(shape))]
    r = prim("reshape", x, shape=tuple(kept)) if tuple(kept) != tuple(src) else x
    return prim("expand", r, shape=tuple(out.shape)) if tuple(kept) != tuple(out.shape) else r


for _n in ("sum", "amax", "amin"):
    implements(getattr(prims, _n).default)(
        lambda out, x, dims, *, output_dtype=None, _n=_n: prim(
            _n,
            x,
            dims=dims_of(dims, len(x.shape or ())),
            keepdim=False,
            **({"dtype": dtype_name(out.dtype)} if _n == "sum" else {}),
        )
    )
for _op in (
    prims.view_of.default,
    prims.collapse_view.default,
    prims.split_dim.default,
    prims.reshape.default,
    prims.squeeze.default,
    prims.collapse.default,
):
    implements(_op)(lambda out, x, *a, **k: prim("reshape", x, shape=tuple(out.shape)))
implements(prims.where.default)(lambda out, c, a, b: prim("where", c, a, b))


@implements(prims.div.default)
def _prims_div(out: torch.Tensor, a: Any, b: Any) -> Node:
    # prims.div truncates integers (C division); only floats divide truly
    integral = not out.dtype.is_floating_point and out.dtype != torch.bool
    return prim("trunc_divide" if integral else "div", a, b)


def _register_same_named_prims() -> None:
    from node.engine import REGISTRY

    for name in REGISTRY:
        op = getattr(prims, name, None)
        ov = getattr(op, "default", None) if op is not None else None
        if (
            ov is not None
            and ov not in RULES
            and name not in ("convert_element_type", "rand", "full")
        ):
            implements(ov)(lambda out, *a, _n=name: prim(_n, *a))


_register_same_named_prims()
