"""Partitions: tensors with at most one nonzero element per slice, and their joint bound.

A histogram is a partition of the rows: each row falls in one cell (or none), so
replacing it moves one count out of a cell and one into another, L1 2 and L2 sqrt 2,
however many cells there are. Per-element bounds see only that each cell may move by
one (L1 the number of cells), and finite-domain tables (:mod:`dpnode.core.privacy.tables`)
see it only when each row's cell is a function of one small-domain scalar. A state's
*partition axes* ``part`` record the structure itself: on every dataset, each slice
along those axes (the other indices fixed) holds at most one nonzero element, in the
exact values and in the engine's computed values alike.

Replacing a subject then changes at most two elements of each slice (the nonzero one
before and the nonzero one after), so a slice moves by at most the sum of its two
largest element changes in L1 and their root sum of squares in L2, and the slices add
up per subject as elements do (:func:`bounds`). Nothing here depends on how the cell
was computed: a cast before the comparison (``x.float()``), rounding at a bin edge or a
code combined from several columns only choose *which* cell a row is in, never put it in
two. What it needs is that each slice's elements change with one owner, which the
per-element ``L`` and ``G`` already say (a cell computed from data-dependent edges is
owned by every subject, and every slice then moves whoever is replaced).

Where the structure comes from and how it moves:

- ``eq(x, v)`` with ``x`` broadcast along some axes (size 1 there) and a public ``v``
  whose values along them are all different once converted to the comparison's dtype:
  one value equals at most one of them (NaN none). This is ``one_hot``, a histogram's
  bin filling (``bin.unsqueeze(-1) == arange(bins)``) and ``histogramdd``'s cell index.
- casts keep it (every cast maps zero to zero); views move its axes (:func:`moved`).
- ``a * b``, ``a & b`` (``logical_and``, ``bitwise_and``): the zeros of either argument
  stay zeros (for a product, when the other's computed values are finite, as ``0 * inf``
  is NaN). Two partitions along axes where the other argument is broadcast combine into
  one along both: ``one_hot(e)[:, :, None] * one_hot(s)[:, None, :]`` has at most one
  nonzero per row in its ``(education, sex)`` plane (:func:`product`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpnode.core.engine.dtypes import opmath
from dpnode.core.engine.prims.elementwise import as_np, operands_of
from dpnode.core.engine.promotion import result_type
from dpnode.core.privacy.arrays import fit, pad_left, varying_axes
from dpnode.core.privacy.rounding import wide
from dpnode.core.privacy.rules.base import Ctx
from dpnode.core.privacy.state import Array, State, fallback_bounds

__all__ = ["bounds", "compared", "moved", "normal", "product"]

Axes = tuple[int, ...]


def normal(axes: Sequence[int], shape: Sequence[int]) -> Axes | None:
    """``axes`` sorted, without those of size 1 (a slice of one element holds one at most).

    >>> normal([2, 0, 1], (3, 1, 4)), normal([1], (3, 1))
    ((0, 2), None)
    """
    kept = tuple(sorted({d for d in axes if shape[d] > 1}))
    return kept or None


def compared(c: Ctx) -> Axes | None:
    """The partition axes of ``eq(a, b)``: where the private side is broadcast and the
    public side's values (known, converted to the comparison's dtype) all differ."""
    nd = len(c.shape)
    for xi in (0, 1):
        x, v = c.args[xi], c.args[1 - xi]
        if x is None or v is None or x.is_public or not v.is_public or v.value is None:
            continue
        xs, vs = (1,) * (nd - len(x.shape)) + x.shape, (1,) * (nd - len(v.shape)) + v.shape
        axes = [d for d in range(nd) if xs[d] == 1 and vs[d] > 1]
        if axes and _distinct(np.asarray(v.value), axes, nd, c):
            return normal(axes, c.shape)
    return None


def _distinct(value: Array, axes: list[int], nd: int, c: Ctx) -> bool:
    """Whether ``value``'s elements along ``axes`` (jointly, the others fixed) all differ
    as the comparison sees them: in its dtype, ``-0.0 == 0.0`` and NaN equal to none."""
    cd = opmath(result_type(operands_of(c.call)))
    v = pad_left(as_np(value, cd), nd)
    rest = [d for d in range(nd) if d not in axes]
    flat = np.transpose(v, rest + axes).reshape(*(v.shape[d] for d in rest), -1)
    srt = np.sort(flat, axis=-1)
    with np.errstate(invalid="ignore"):
        return bool(np.all(srt[..., 1:] > srt[..., :-1]))  # NaN compares False: refused


def product(c: Ctx, a: State, b: State) -> Axes | None:
    """The partition axes of ``a * b`` (or ``a & b``): see the module docstring."""
    nd = len(c.shape)
    parts: list[Axes | None] = []
    for x, other in ((a, b), (b, a)):
        if x.part is None or (c.node.op == "mul" and not _finite(other)):
            parts.append(None)
            continue
        parts.append(tuple(d + nd - len(x.shape) for d in x.part))
    pa, pb = parts
    if pa is not None and pb is not None:
        sa = (1,) * (nd - len(a.shape)) + a.shape
        sb = (1,) * (nd - len(b.shape)) + b.shape
        if all(sa[d] == 1 for d in pb if d not in pa) and all(
            sb[d] == 1 for d in pa if d not in pb
        ):
            return normal(pa + pb, c.shape)
    found = [p for p in parts if p is not None]
    if not found:
        return None
    return max(found, key=lambda p: math.prod(c.shape[d] for d in p))


def _finite(s: State) -> bool:
    """Whether every computed value of ``s`` is finite (a product with 0 is then 0)."""
    lo, hi = wide(s)
    with np.errstate(invalid="ignore"):
        return bool(np.isfinite(lo).all() and np.isfinite(hi).all())


def moved(op: str, attrs: Mapping[str, Any], src: Axes, before: Axes, after: Axes) -> Axes | None:
    """The partition axes ``src`` of a tensor of shape ``before`` after the view ``op``
    gives it shape ``after`` (None: not kept).

    >>> moved("unsqueeze", {"dim": 0}, (1,), (5, 4), (1, 5, 4))
    (2,)
    >>> moved("reshape", {}, (1, 2), (5, 8, 2), (5, 16))
    (1,)
    >>> moved("reshape", {}, (1,), (5, 16), (80,)) is None
    True
    """
    nd_in, nd_out = len(before), len(after)
    if op in ("slice", "flip"):
        return normal(src, after)
    if op == "expand":  # leading axes added; each slice copied along broadcast ones
        return normal([d + nd_out - nd_in for d in src], after)
    if op == "permute":
        dims = [int(d) % nd_in for d in attrs["dims"]]
        return normal([j for j, d in enumerate(dims) if d in src], after)
    if op in ("reshape", "squeeze", "unsqueeze"):  # size-1 axes in or out: by groups
        kept: list[int] = []
        for ins, outs in _groups(before, after):
            if ins and all(d in src for d in ins):
                kept += outs
        return normal(kept, after)
    return None


def _groups(src: Axes, dst: Axes) -> list[tuple[list[int], list[int]]]:
    """The axes of ``src`` and ``dst`` (sizes > 1) that a C-order reshape maps onto each
    other, group by group (a group's sizes have equal products).

    >>> _groups((5, 8, 2), (5, 1, 16))
    [([0], [0]), ([1, 2], [2])]
    """
    big_in = [d for d, n in enumerate(src) if n > 1]
    big_out = [d for d, n in enumerate(dst) if n > 1]
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(big_in) and j < len(big_out):
        ins, outs = [big_in[i]], [big_out[j]]
        pi, pj = src[big_in[i]], dst[big_out[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj and i < len(big_in):
                ins.append(big_in[i])
                pi *= src[big_in[i]]
                i += 1
            elif pj < pi and j < len(big_out):
                outs.append(big_out[j])
                pj *= dst[big_out[j]]
                j += 1
            else:  # pragma: no cover - shapes of one size always close their groups
                return out
        out.append((ins, outs))
    return out


def bounds(s: State, nsub: int) -> tuple[Array, Array] | None:
    """Per-subject L1 and L2 bounds of the change of ``s`` from its partition axes (None:
    none, or owners that differ within a slice).

    Each slice moves by at most its two largest element changes (``L`` when its owner is
    replaced, ``G`` when another subject is): the slices are then summed per subject as
    single elements are, by the per-element fallback on the state of one element per
    slice.
    """
    axes = s.part
    if axes is None:
        return None
    shape = s.shape
    owner = fit(s.owner, shape)
    if any(varying_axes(owner, shape, exact=True)[d] for d in axes):
        return None
    pick = tuple(slice(0, 1) if d in axes else slice(None) for d in range(len(shape)))
    slices = tuple(1 if d in axes else n for d, n in enumerate(shape))
    (l1, l2), (g1, g2) = (_top_two(a, shape, axes) for a in (s.L, s.G))
    z = np.zeros((1,) * len(shape))
    own = owner[pick]
    t1, _ = fallback_bounds(State(slices, s.dtype, z, z, own, l1, g1), nsub)
    _, t2 = fallback_bounds(State(slices, s.dtype, z, z, own, l2, g2), nsub)
    return t1, t2


def _top_two(a: Array, shape: tuple[int, ...], axes: Axes) -> tuple[Array, Array]:
    """Per slice along ``axes``: the sum of the two largest elements of ``a`` (broadcast
    to ``shape``), and their root sum of squares; the axes kept as 1s.

    >>> s, q = _top_two(np.array([[1.0, 3.0, 2.0]]), (4, 3), (1,))
    >>> s.tolist(), q.round(6).tolist()
    ([[5.0]], [[3.605551]])
    """
    f = np.asarray(fit(a, shape), dtype=np.float64)
    size = math.prod(shape[d] for d in axes)
    var = [d for d in axes if f.shape[d] > 1]
    kept = tuple(1 if d in var else n for d, n in enumerate(f.shape))
    if not var or math.prod(f.shape[d] for d in var) < size:
        # every slice's largest element appears at least twice (broadcast along an axis)
        top = f.max(axis=tuple(var), keepdims=True) if var else f
        if size < 2:
            return top, top
        return 2 * top, math.sqrt(2) * top
    rest = tuple(n for d, n in enumerate(f.shape) if d not in var)
    g = np.moveaxis(f, var, list(range(-len(var), 0))).reshape(*rest, -1)
    two = np.partition(g, g.shape[-1] - 2, axis=-1)[..., -2:]
    with np.errstate(over="ignore"):
        return two.sum(axis=-1).reshape(kept), np.hypot(two[..., 0], two[..., 1]).reshape(kept)
