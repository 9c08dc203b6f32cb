"""Histograms on remote tensors: ``histc``, ``histogram`` and ``histogramdd``.

The counts are private values of a public shape (one per bin). Each value finds its bin by
comparisons with the edges (the number of edges at or below it, which is
``searchsorted(edges, x, right=True)`` for sorted edges; torch's linear formula for
``histc``), and the bins are filled by a one-hot comparison of that bin with the public bin
numbers, summed over the values: values outside the range (and NaN) get a bin number past the
last and are counted nowhere. Comparisons and sums have privacy rules, so a histogram of a
private column over a public range publishes, at the sensitivity of a partition (one row moves
one count from a bin to another: L1 2). Edges from the data's own range (no range given) are
private values too, and their ``histc`` still fills its bins with ``scatter_add``, which has no
privacy rule on private data.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from dpnode.sdk._remote.dispatch import SPECIAL
from dpnode.sdk._remote.graph import Node, constant, prim
from dpnode.sdk._remote.rules import dtype_name, implements

__all__: list[str] = []

aten = torch.ops.aten


def _fill(index: Node, weight: Node | None, bins: int, name: str) -> Node:
    """Per bin ``0 .. bins - 1``, the count (or the weights' sum) of the values whose bin
    ``index`` is it: a one-hot comparison with the public bin numbers, summed."""
    numbers = prim("arange", start=0, end=bins, step=1, dtype="int64")
    onehot = prim(
        "convert_element_type", prim("eq", prim("unsqueeze", index, dim=-1), numbers), dtype=name
    )
    if weight is not None:
        onehot = prim("mul", onehot, prim("unsqueeze", weight, dim=-1))
    return prim("sum", onehot, dims=(0,))


def _at_or_below(edges: Node, x: Node) -> Node:
    """How many of ``edges`` (1-d, sorted) are at or below each of ``x`` (1-d): for sorted
    edges, ``searchsorted(edges, x, right=True)``; by comparisons, which have privacy rules."""
    return prim("sum", prim("le", edges, prim("unsqueeze", x, dim=-1)), dims=(-1,), dtype="int64")


@implements(aten.histc.default)
def _histc(out: torch.Tensor, x: Node, bins: int = 100, min: Any = 0, max: Any = 0) -> Node:
    """torch.histc: counts in ``bins`` equal bins over [min, max] (the data's range if equal).

    bin = trunc((x - min) * bins / (max - min)) in x's dtype (min and max cast to it first,
    as torch's kernel does), x == max in the last bin, values
    outside the range (and NaN) counted nowhere: they land in a discarded extra bin.
    """
    name = dtype_name(out.dtype)
    flat = prim("reshape", x, shape=(-1,))
    lo: Any
    hi: Any
    if float(min) == float(max):  # the data's own range, widened by 1 when it is one value
        lo, hi = prim("amin", flat), prim("amax", flat)
        same = prim("eq", lo, hi)
        lo = prim("where", same, prim("sub", lo, 1), lo)
        hi = prim("where", same, prim("add", hi, 1), hi)
        if math.prod(x.shape or ()) == 0:
            lo, hi = float(min) - 1, float(max) + 1
    else:
        lo, hi = float(min), float(max)
    if isinstance(hi, float) and isinstance(lo, float):  # the ends' difference in the dtype
        width: Any = float(torch.tensor(hi, dtype=out.dtype) - torch.tensor(lo, dtype=out.dtype))
    else:
        width = prim("sub", hi, lo)
    inside = prim("logical_and", prim("ge", flat, lo), prim("le", flat, hi))
    if isinstance(lo, float) and isinstance(hi, float) and out.dtype in _FLOAT_BITS:
        # a public range: each bin's first value by torch's formula, and comparisons
        thresholds = constant(torch.from_numpy(_histc_thresholds(lo, hi, bins, out.dtype).copy()))
        index = prim("where", inside, _at_or_below(thresholds, flat), bins)
        return _fill(index, None, bins, name)
    scaled = prim("div", prim("mul", prim("sub", flat, lo), bins), width)
    pos = prim("clamp", prim("convert_element_type", scaled, dtype="int64"), 0, bins - 1)
    index = prim("where", inside, pos, bins)
    n = math.prod(x.shape or ())
    ones = prim("full", shape=(n,), value=1.0, dtype=name)
    hist = prim(
        "scatter_add", prim("full", shape=(bins + 1,), value=0.0, dtype=name), index, ones, dim=0
    )
    return prim("slice", hist, dim=0, start=0, end=bins, step=1)


#: float dtype -> (NumPy dtype, the unsigned integer of its bits, its sign bit)
_FLOAT_BITS: dict[torch.dtype, tuple[Any, Any, int]] = {
    torch.float32: (np.float32, np.uint32, 1 << 31),
    torch.float64: (np.float64, np.uint64, 1 << 63),
}


@functools.lru_cache(maxsize=256)
def _histc_thresholds(lo: float, hi: float, bins: int, dtype: torch.dtype) -> Any:
    """For k = 1 .. bins - 1, the smallest value ``x`` of ``dtype`` in ``[lo, hi]`` whose bin by
    ``histc``'s formula, ``trunc((x - lo) * bins / (hi - lo))`` with every operand and step in
    ``dtype`` (the range's ends too), is at least k
    (``inf`` if none): a value's bin is then the number of thresholds at or below it. The
    formula is monotone in ``x``, so a bisection over the dtype's values in order finds each.

    Read-only and kept for the same arguments: the bisection takes 5 to 13 ms, and a
    histogram recorded again (a loop, a cell run twice) need not take them again.
    """
    ftype, utype, sign = _FLOAT_BITS[dtype]
    flo, scale = ftype(lo), ftype(bins)
    width = ftype(hi) - flo  # in the dtype, as torch's kernel takes it

    def key(v: Any) -> Any:  # the values of the dtype, in order, as integers
        bits = np.asarray(v, dtype=ftype).view(utype).astype(object)
        return np.where(bits >= sign, -(bits - sign), bits)

    def value(k: Any) -> Any:
        bits = np.array([int(b) if b >= 0 else sign - int(b) for b in k], dtype=utype)
        return bits.view(ftype)

    targets = np.arange(1, bins, dtype=np.float64)
    first, last = int(key(ftype(lo))), int(key(ftype(hi)))
    low = np.full(bins - 1, first, dtype=object)  # f(low) < k, or low is the answer
    high = np.full(bins - 1, last + 1, dtype=object)  # f(high) >= k (last + 1: none yet)
    while bool(np.any(high - low > 1)):
        mid = (low + high) // 2
        with np.errstate(all="ignore"):
            f = ((value(mid) - flo) * scale) / width
        reached = f.astype(np.float64) >= targets
        high = np.where(reached, mid, high)
        low = np.where(reached, low, mid)
    with np.errstate(all="ignore"):
        at_first = ((ftype(lo) - flo) * scale) / width >= targets
    found = np.where(at_first, first, high)
    edges = value(np.minimum(found, last)).astype(ftype)
    thresholds = np.where(found > last, ftype(np.inf), edges).astype(ftype)
    thresholds.flags.writeable = False
    return thresholds


def _linspace(lo: Any, hi: Any, steps: int, name: str) -> Node:
    """torch.linspace's values: start + i step for the first half, end - (n - 1 - i) step after."""
    i = prim("arange", start=0.0, end=float(steps), step=1.0, dtype=name)
    if isinstance(lo, float) and isinstance(hi, float):
        lo = prim("full", shape=(), value=lo, dtype=name)
        hi = prim("full", shape=(), value=hi, dtype=name)
    step = prim("div", prim("sub", hi, lo), float(max(steps - 1, 1)))
    front = prim("add", lo, prim("mul", step, i))
    back = prim("sub", hi, prim("mul", step, prim("sub", float(steps - 1), i)))
    return prim("where", prim("lt", i, float(steps // 2)), front, back)


def _histogram(
    x: Node, edges: Node, nbins: int, weight: Node | None, density: bool, name: str
) -> Node:
    """Counts (or weights) per bin: bin = searchsorted(edges, x, right) - 1, x == last edge in
    the last bin, values outside the edges (and NaN) counted nowhere (a dropped extra bin)."""
    flat = prim("reshape", x, shape=(-1,))
    pos = prim("sub", _at_or_below(edges, flat), 1)
    first = prim("slice", edges, dim=0, start=0, end=1, step=1)
    last = prim("slice", edges, dim=0, start=nbins, end=nbins + 1, step=1)
    pos = prim("where", prim("eq", flat, last), nbins - 1, pos)
    inside = prim("logical_and", prim("ge", flat, first), prim("le", flat, last))
    index = prim("where", inside, pos, nbins)
    w = None if weight is None else prim("reshape", weight, shape=(-1,))
    hist = _fill(index, w, nbins, name)
    if density:
        widths = prim(
            "sub",
            prim("slice", edges, dim=0, start=1, end=nbins + 1, step=1),
            prim("slice", edges, dim=0, start=0, end=nbins, step=1),
        )
        hist = prim("div", hist, prim("mul", prim("sum", hist), widths))
    return hist


def _histogram_bins(
    out: Any,
    x: Node,
    bins: int = 100,
    *,
    range: Any = None,
    weight: Node | None = None,
    density: bool = False,
) -> tuple[Node, Node]:
    name = dtype_name(out[0].dtype)
    lo: Any
    hi: Any
    if range is not None:
        lo, hi = float(range[0]), float(range[1])
    elif math.prod(x.shape or ()) == 0:
        lo, hi = 0.0, 0.0
    else:
        flat = prim("reshape", x, shape=(-1,))
        lo, hi = prim("amin", flat), prim("amax", flat)
    if isinstance(lo, float) and isinstance(hi, float):
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
    else:  # one value: torch widens the range by 0.5 each side
        same = prim("eq", lo, hi)
        lo = prim("where", same, prim("sub", lo, 0.5), lo)
        hi = prim("where", same, prim("add", hi, 0.5), hi)
    edges = _linspace(lo, hi, bins + 1, name)
    return _histogram(x, edges, bins, weight, density, name), edges


def _histogram_edges(
    out: Any, x: Node, bins: Node, *, weight: Node | None = None, density: bool = False
) -> tuple[Node, Node]:
    nbins = math.prod(bins.shape or ()) - 1
    return _histogram(x, bins, nbins, weight, density, dtype_name(out[0].dtype)), bins


def _histogram_special(which: Any) -> Any:
    # torch.histogram has no meta kernel: build the outputs' metadata here
    def handler(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from dpnode.sdk._remote.dispatch import _to_nodes, _wrap
        from dpnode.sdk._remote.tensor import RemoteTensor

        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if not any(isinstance(t, RemoteTensor) for t in tensors):
            return which(*args, **kwargs)
        x = args[0]
        bins = args[1] if len(args) > 1 else kwargs.get("bins", 100)
        nbins = bins.numel() - 1 if isinstance(bins, torch.Tensor) else int(bins)
        metas = (
            torch.empty((nbins,), dtype=x.dtype, device="meta"),
            torch.empty((nbins + 1,), dtype=x.dtype, device="meta"),
        )
        rule = _histogram_edges if isinstance(bins, torch.Tensor) else _histogram_bins
        nodes = rule(
            metas, *[_to_nodes(a) for a in args], **{k: _to_nodes(v) for k, v in kwargs.items()}
        )
        source = next((t._source for t in tensors if isinstance(t, RemoteTensor)), "")
        return _wrap(metas, nodes, source)

    return handler


SPECIAL[aten.histogram.bin_ct] = _histogram_special(aten.histogram.bin_ct)
SPECIAL[aten.histogram.bins_tensor] = _histogram_special(aten.histogram.bins_tensor)


# -- histogramdd: one searchsorted per dimension, cells by a flat index ----------------------


def _range_edges(col: Node, bins: int, rng: Any, name: str) -> Node:
    """One dimension's edges: linspace over ``rng`` or the column's range (±0.5 if one value)."""
    lo: Any
    hi: Any
    if rng is not None:
        lo, hi = float(rng[0]), float(rng[1])
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
    elif math.prod(col.shape or ()) == 0:
        lo, hi = -0.5, 0.5
    else:
        lo, hi = prim("amin", col), prim("amax", col)
        same = prim("eq", lo, hi)
        lo = prim("where", same, prim("sub", lo, 0.5), lo)
        hi = prim("where", same, prim("add", hi, 0.5), hi)
    return _linspace(lo, hi, bins + 1, name)


def _columns(x: Node) -> tuple[list[Node], int, int]:
    """The D columns of points (..., D) flattened to (n, D), and n, D."""
    shape = tuple(x.shape or ())
    dims = shape[-1]
    n = math.prod(shape[:-1])
    flat = prim("reshape", x, shape=(n, dims))
    cols = [
        prim("squeeze", prim("slice", flat, dim=1, start=k, end=k + 1, step=1), dims=(1,))
        for k in range(dims)
    ]
    return cols, n, dims


def _histogramdd_counts(
    x: Node, edges: list[Node], counts: list[int], weight: Node | None, density: bool, name: str
) -> Node:
    cols, _, dims = _columns(x)
    total_cells = math.prod(counts)
    cell: Any = None
    valid: Any = None
    for k in range(dims):
        e, b = edges[k], counts[k]
        pos = prim("sub", _at_or_below(e, cols[k]), 1)
        first = prim("slice", e, dim=0, start=0, end=1, step=1)
        last = prim("slice", e, dim=0, start=b, end=b + 1, step=1)
        pos = prim("where", prim("eq", cols[k], last), b - 1, pos)
        inside = prim("logical_and", prim("ge", cols[k], first), prim("le", cols[k], last))
        valid = inside if valid is None else prim("logical_and", valid, inside)
        stride = math.prod(counts[k + 1 :])
        term = prim("mul", pos, stride)
        cell = term if cell is None else prim("add", cell, term)
    index = prim("where", valid, cell, total_cells)
    w = None if weight is None else prim("reshape", weight, shape=(-1,))
    hist = prim("reshape", _fill(index, w, total_cells, name), shape=tuple(counts))
    if density:
        hist = prim("div", hist, prim("sum", hist))
        for k in range(dims):
            b = counts[k]
            width = prim(
                "sub",
                prim("slice", edges[k], dim=0, start=1, end=b + 1, step=1),
                prim("slice", edges[k], dim=0, start=0, end=b, step=1),
            )
            shape = [1] * dims
            shape[k] = b
            hist = prim("div", hist, prim("reshape", width, shape=tuple(shape)))
    return hist


def _hdd_special(kind: str) -> Any:
    """Handlers for the three ATen ops torch.histogramdd calls (none has a meta kernel)."""
    op = getattr(aten, f"_histogramdd_{kind}").default

    def handler(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from dpnode.sdk._remote.dispatch import _to_nodes, _wrap, node_of
        from dpnode.sdk._remote.tensor import RemoteTensor

        flat_args = [*args, *kwargs.values()]
        tensors = [a for a in flat_args if isinstance(a, torch.Tensor)]
        for a in flat_args:
            if isinstance(a, (list, tuple)):
                tensors += [t for t in a if isinstance(t, torch.Tensor)]
        if not any(isinstance(t, RemoteTensor) for t in tensors):
            return op(*args, **kwargs)
        x, bins = args[0], args[1]
        weight = kwargs.get("weight")
        wnode = node_of(weight) if isinstance(weight, torch.Tensor) else None
        name = dtype_name(x.dtype)
        xn = node_of(x)
        cols, _, dims = _columns(xn)
        source = next(t._source for t in tensors if isinstance(t, RemoteTensor))
        if kind == "from_bin_tensors":
            edges = list(_to_nodes(list(bins)))
            counts = [t.numel() - 1 for t in bins]
        else:
            counts = [int(b) for b in bins]
            rng = kwargs.get("range")
            pairs = [None] * dims if rng is None else [rng[2 * k : 2 * k + 2] for k in range(dims)]
            edges = [_range_edges(cols[k], counts[k], pairs[k], name) for k in range(dims)]
        if kind == "bin_edges":
            metas = [torch.empty((b + 1,), dtype=x.dtype, device="meta") for b in counts]
            return _wrap(metas, edges, source)
        meta = torch.empty(tuple(counts), dtype=x.dtype, device="meta")
        hist = _histogramdd_counts(xn, edges, counts, wnode, bool(kwargs.get("density")), name)
        return _wrap(meta, hist, source)

    return handler


for _kind in ("bin_edges", "from_bin_cts", "from_bin_tensors"):
    SPECIAL[getattr(aten, f"_histogramdd_{_kind}").default] = _hdd_special(_kind)
