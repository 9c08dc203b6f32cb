"""Statistics with public output shapes: ``mode``, ``segment_reduce``, ``embedding_bag``.

Each is private values in a public shape (one mode per row, one value per segment or
bag), so they are recorded like any other computation: a sort and run lengths for
the mode, segments and bags found by a searchsorted among their (private) ends.
Histograms live in ``rules_histogram``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sdk._remote.graph import Node, prim
from sdk._remote.rules import dtype_name, implements

__all__: list[str] = []

aten = torch.ops.aten


def _arange(n: int, shape: tuple[int, ...], d: int) -> Node:
    """0..n-1 along dim ``d`` of ``shape`` (int64), broadcast to ``shape``."""
    lifted = [1] * len(shape)
    lifted[d] = n
    r = prim("arange", start=0.0, end=float(n), step=1.0, dtype="int64")
    return prim("expand", prim("reshape", r, shape=tuple(lifted)), shape=shape)


def _running(x: Node, d: int, which: str) -> Node:
    return prim("gather", x, prim(which, x, dim=d), dim=d)


@implements(aten.mode.default)
def _mode(out: Any, x: Node, dim: int = -1, keepdim: bool = False) -> tuple[Node, Node]:
    """torch.mode: the smallest of the most frequent values, and its last index.

    Sorted, equal values form runs; each element's run length is (end - start + 1),
    with starts from a running max of run-start positions and ends from a running min
    taken from the right. The first maximum in sorted order is the smallest value.
    """
    shape = tuple(x.shape or ())
    if not shape:
        return x, prim("full", shape=(), value=0.0, dtype="int64")
    d = dim % len(shape)
    n = shape[d]
    pos = _arange(n, shape, d)
    s = prim("gather", x, prim("argsort", x, dim=d), dim=d)
    prev = prim(
        "cat",
        prim("slice", s, dim=d, start=0, end=1, step=1),
        prim("slice", s, dim=d, start=0, end=n - 1, step=1),
        dim=d,
    )
    nxt = prim(
        "cat",
        prim("slice", s, dim=d, start=1, end=n, step=1),
        prim("slice", s, dim=d, start=n - 1, end=n, step=1),
        dim=d,
    )
    is_first = prim("logical_or", prim("ne", s, prev), prim("eq", pos, 0))
    is_last = prim("logical_or", prim("ne", s, nxt), prim("eq", pos, n - 1))
    start = _running(prim("where", is_first, pos, 0), d, "cumargmax")
    ends_rev = prim("flip", prim("where", is_last, pos, n), dims=(d,))
    end = prim("flip", _running(ends_rev, d, "cumargmin"), dims=(d,))
    length = prim("sub", end, start)
    best = prim("argmax", length, dim=d, keepdim=True)
    value = prim("gather", s, best, dim=d)
    hit = prim("eq", x, value)
    index = prim("amax", prim("where", hit, pos, -1), dims=(d,), keepdim=True)
    if not keepdim:
        value, index = prim("squeeze", value, dims=(d,)), prim("squeeze", index, dims=(d,))
    return value, index


_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}
_SEGMENT_REDUCE = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "amax", "min": "amin"}


@implements(aten.segment_reduce.default)
def _segment_reduce(
    out: torch.Tensor,
    data: Node,
    reduce: str,
    *,
    lengths: Node | None = None,
    indices: Node | None = None,
    offsets: Node | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: Any = None,
) -> Any:
    """Reduce consecutive segments of ``data`` along ``axis`` (lengths or offsets are private).

    Row i belongs to the segment whose end is the first one above i: a searchsorted of i
    among the segments' ends. ``initial`` joins every segment (a mean does not count it);
    empty segments give ``initial``, or the reduction's identity (NaN for a mean).
    """
    if indices is not None or reduce not in _SEGMENT_REDUCE:
        return NotImplemented
    shape = tuple(data.shape or ())
    ax = axis % len(shape)
    n = shape[ax]
    segments = tuple(out.shape)[ax]
    name = dtype_name(out.dtype)
    if lengths is not None:
        ends = prim("cumsum", lengths, dim=-1, dtype="int64")
    elif offsets is not None:
        m = segments + 1
        starts = prim("slice", offsets, dim=-1, start=0, end=1, step=1)
        ends = prim("sub", prim("slice", offsets, dim=-1, start=1, end=m, step=1), starts)
        ends = prim("convert_element_type", ends, dtype="int64")
    else:
        return NotImplemented
    # lengths/offsets carry data's leading dims (one segmentation per leading index)
    batch = shape[:ax]
    rows = prim("arange", start=0.0, end=float(n), step=1.0, dtype="int64")
    if batch:
        rows = prim("expand", rows, shape=(*batch, n))
    seg = prim("searchsorted", ends, rows, right=True)
    lifted = (*batch, n) + (1,) * (len(shape) - ax - 1)
    index = prim("expand", prim("reshape", seg, shape=lifted), shape=shape)
    fill = _SEGMENT_IDENTITY[reduce] if initial is None else float(initial)
    base = prim("full", shape=tuple(out.shape), value=fill, dtype=name)
    total = prim("scatter_reduce", base, index, data, dim=ax, reduce=_SEGMENT_REDUCE[reduce])
    if reduce != "mean":
        return total
    ones = prim("full", shape=shape, value=1.0, dtype=name)
    zeros = prim("full", shape=tuple(out.shape), value=0.0, dtype=name)
    count = prim("scatter_add", zeros, index, ones, dim=ax)
    if initial is not None:
        count = prim("clamp", count, 1.0, None)
    return prim("div", total, count)


@implements(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def _embedding_bag(
    out: Any,
    weight: Node,
    indices: Node,
    offsets: Node,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Node | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> Any:
    """Sum, mean or max of weight rows per bag; bag i spans offsets[i]..offsets[i + 1].

    Offsets and indices may be private: each index finds its bag by a searchsorted among
    the bags' starts. The auxiliary outputs follow torch's forward kernel: bag ids
    (offset2bag) and bag sizes for mean/max, the arg max rows for max, zeros otherwise.
    """
    bags, dim = tuple(out[0].shape)
    n = math.prod(indices.shape or ())
    name = dtype_name(out[0].dtype)
    if n == 0 or bags == 0:
        return tuple(
            prim("full", shape=tuple(o.shape), value=0.0, dtype=dtype_name(o.dtype)) for o in out
        )
    starts = prim("slice", offsets, dim=0, start=0, end=bags, step=1)
    rows = prim("arange", start=0.0, end=float(n), step=1.0, dtype="int64")
    bag = prim("sub", prim("searchsorted", starts, rows, right=True), 1)
    vals = prim("index_select", weight, indices, dim=0)
    if per_sample_weights is not None:
        vals = prim("mul", vals, prim("unsqueeze", per_sample_weights, dim=1))
    valid = prim("full", shape=(n,), value=1.0, dtype="bool")
    if padding_idx is not None and padding_idx >= 0:
        valid = prim("ne", indices, padding_idx)
    if include_last_offset:  # the last offset ends the last bag: later indices count nowhere
        end = prim("slice", offsets, dim=0, start=bags, end=bags + 1, step=1)
        valid = prim("logical_and", valid, prim("lt", rows, end))
    index = prim("expand", prim("unsqueeze", bag, dim=1), shape=(n, dim))
    valid2 = prim("unsqueeze", valid, dim=1)
    zeros = prim("full", shape=(bags, dim), value=0.0, dtype=name)
    count = prim(
        "scatter_add",
        prim("full", shape=(bags,), value=0.0, dtype="int64"),
        bag,
        prim("convert_element_type", valid, dtype="int64"),
        dim=0,
    )
    if mode == 2:
        low = prim("full", shape=(bags, dim), value=-math.inf, dtype=name)
        src = prim("where", valid2, vals, -math.inf)
        best = prim("scatter_reduce", low, index, src, dim=0, reduce="amax")
        result = prim("where", prim("gt", prim("unsqueeze", count, dim=1), 0), best, 0.0)
    else:
        total = prim("scatter_add", zeros, index, prim("where", valid2, vals, 0.0), dim=0)
        result = total
        if mode == 1:
            denom = prim("clamp", prim("unsqueeze", count, dim=1), 1, None)
            result = prim("div", total, prim("convert_element_type", denom, dtype=name))
    aux = []
    for k, o in enumerate(out[1:], 1):
        shape = tuple(o.shape)
        if k == 1 and shape == (n,):
            aux.append(bag)
        elif k == 2 and mode != 0:
            aux.append(count)
        elif k == 3 and mode == 2:
            # the weight row holding each bag's maximum: the max over members of where
            # (value == max, index, -1), per column
            hit = prim(
                "logical_and", prim("eq", vals, prim("gather", result, index, dim=0)), valid2
            )
            cand = prim(
                "where", hit, prim("expand", prim("unsqueeze", indices, dim=1), shape=(n, dim)), -1
            )
            start = prim("full", shape=(bags, dim), value=-1.0, dtype="int64")
            aux.append(prim("scatter_reduce", start, index, cand, dim=0, reduce="amax"))
        elif k == 3 and mode == 1:
            aux.append(count)
        else:
            aux.append(prim("full", shape=shape, value=0.0, dtype=dtype_name(o.dtype)))
    return (result, *aux)
