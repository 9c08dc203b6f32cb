"""Rules of the reductions: sum, mean, amax, amin, any, all, argmax, argmin.

A sum over elements that share one owner keeps the owner and adds their ``L`` and
``G``. Over several owners it is mixed, and moves by at most the worst subject's
share: ``sum G`` plus ``max_s sum_{owner = s} (L - G)`` (a segment sum per output).
Extremes are 1-Lipschitz in the largest element change; argmax/argmin jump by the
index range whenever an element may move. Per-subject joint bounds pass through a
sum unchanged in L1 and grow by ``sqrt(k)`` in L2, ``k`` being the most elements of
one subject summed into one output (Cauchy-Schwarz).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from dpnode.core.privacy.arrays import fit, reduce_array, varying_axes
from dpnode.core.privacy.rules.base import Ctx, finish, rule
from dpnode.core.privacy.state import MIXED, PUBLIC, Array, State, has_joint, joint, public_state
from dpnode.core.privacy.subjects import Rows, rows_of

__all__ = ["aggregate", "reduce_array"]

_BIG = np.iinfo(np.int64).max


def dims_of(c: Ctx, ndim: int) -> tuple[int, ...]:
    """The reduced dims, normalised (none given: all)."""
    dims = c.call.attrs.get("dims")
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted(d % ndim for d in dims))


def _rows_shape(s: State, dims: tuple[int, ...]) -> tuple[int, ...]:
    """The shape to materialise for a reduction: kept axes only where something varies."""
    vary = [
        any(v) for v in zip(*(varying_axes(a, s.shape) for a in (s.owner, s.L, s.G)), strict=True)
    ]
    return tuple(n if (d in dims or vary[d]) else 1 for d, n in enumerate(s.shape))


def _to_rows(a: Array, shape: tuple[int, ...], dims: tuple[int, ...]) -> Array:
    kept = [d for d in range(len(shape)) if d not in dims]
    b = np.broadcast_to(a, shape).transpose(kept + list(dims))
    r = math.prod(shape[d] for d in dims)
    return b.reshape(-1, r)


def _worst_subject(o: Array, d: Array, nsub: int) -> tuple[Array, Array]:
    """Per output row: max over subjects of the summed ``d``, and per subject: most elements."""
    rows = o.shape[0]
    extra = np.zeros(rows)
    kmax = np.zeros(max(nsub, 1))
    ov = o[0]
    if rows == 1 or bool((o == ov).all()):
        priv = ov >= 0
        keys = ov[priv]
        if not keys.size:
            return extra, kmax
        dp = d if priv.all() else d[:, priv]
        steps = np.diff(keys)
        if (steps > 0).all():  # one element per subject: no segments to add
            kmax[keys] = 1
            return dp.max(axis=1), kmax
        if not (steps >= 0).all():
            perm = np.argsort(keys, kind="stable")
            keys, dp = keys[perm], dp[:, perm]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        extra = np.add.reduceat(dp, starts, axis=1).max(axis=1)
        kmax[keys[starts]] = np.diff(np.r_[starts, keys.size])
        return extra, kmax
    j = np.broadcast_to(np.arange(rows)[:, None], o.shape)
    priv = o >= 0
    keys = j[priv].astype(np.int64) * max(nsub, 1) + o[priv]
    uniq, inv = np.unique(keys, return_inverse=True)
    sums = np.bincount(inv, d[priv])
    counts = np.bincount(inv)
    np.maximum.at(extra, uniq // max(nsub, 1), sums)
    np.maximum.at(kmax, uniq % max(nsub, 1), counts)
    return extra, kmax


def _aggregate_rows(
    s: State, dims: tuple[int, ...], nsub: int, how: str, rows: Rows, kfull: Array
) -> tuple[Array, Array, Array, Array] | None:
    """``aggregate`` over the row axis of a state owned row by row by a subject column.

    Every output sums the same rows, so its owners are all the column's subjects: it is
    mixed (the column has two subjects at least), and subject ``s`` holds ``count_s``
    rows of ``per_row = prod(other reduced dims)`` elements each. When ``L - G`` does not
    vary along the rows, the worst subject's share is ``max_rows`` times one row's;
    otherwise the rows' shares are summed per subject (distinct or contiguous ids).
    None: no fast path (the caller takes the general one).
    """
    shape, a, sub = s.shape, rows.axis, rows.subjects
    if sub.max_rows == sub.rows:  # one subject owns every row: not mixed
        return None
    nd = len(shape)
    others = tuple(d for d in dims if d != a)
    per_row = math.prod(shape[d] for d in others)
    mixed = np.full((1,) * nd, MIXED, dtype=np.int64)
    L, G = fit(s.L, shape), fit(s.G, shape)
    if how != "sum":
        both = reduce_array(np.maximum(L, G), shape, dims, "max")
        return mixed, both, both, kfull
    sum_g = reduce_array(G, shape, dims)
    d = reduce_array(L - G, shape, others)  # each row's share, per output
    if d.shape[a] == 1:
        extra = sub.max_rows * np.max(d, axis=a, keepdims=True)
    elif sub.distinct:  # one row per subject
        extra = np.max(d, axis=a, keepdims=True)
    elif sub.contiguous and sub.starts is not None:
        seg = np.add.reduceat(d, sub.starts, axis=a)
        extra = np.max(seg, axis=a, keepdims=True)
    else:
        return None
    bound = sum_g + np.maximum(extra, 0.0)
    # elements of subject s summed into one output (all of them once other subjects move G)
    kmax = kfull if np.any(G > 0) else sub.spread(sub.counts * float(per_row), max(nsub, 1))
    return mixed, bound, bound, kmax


def aggregate(
    s: State, dims: tuple[int, ...], nsub: int, how: str = "sum"
) -> tuple[Array, Array, Array, Array]:
    """Owner, ``L``, ``G`` of each reduction output (dims kept as 1s), and per-subject ``k``.

    ``how`` is "sum" (the changes add) or "max" (the output moves like its largest element).
    """
    shape = s.shape
    r = math.prod(shape[d] for d in dims)
    kfull = np.full(1, float(r))  # per-subject vectors: shape (1,) or (nsub,)
    if not any(varying_axes(s.owner, shape, exact=True)[d] for d in dims):
        pick = tuple(slice(0, 1) if d in dims else slice(None) for d in range(len(shape)))
        owner = fit(s.owner, shape)[pick]
        return (
            owner,
            reduce_array(s.L, shape, dims, how),
            reduce_array(s.G, shape, dims, how),
            kfull,
        )
    rows = rows_of(s.owner, shape)
    if rows is not None and rows.axis in dims:
        fast = _aggregate_rows(s, dims, nsub, how, rows, kfull)
        if fast is not None:
            return fast
    rshape = _rows_shape(s, dims)
    o = _to_rows(s.owner, rshape, dims)
    pub = bool((o == PUBLIC).any())
    omin = (np.where(o == PUBLIC, _BIG, o) if pub else o).min(axis=1)
    omax = (np.where(o == PUBLIC, -_BIG, o) if pub else o).max(axis=1)
    single = (omin == omax) & (omin >= 0)
    owner = np.where(omin == _BIG, PUBLIC, np.where(single, omin, MIXED))
    out = tuple(1 if d in dims else n for d, n in enumerate(rshape))
    lc, gc = fit(s.L, shape), fit(s.G, shape)
    flat = all(lc.shape[d] == 1 and gc.shape[d] == 1 for d in dims)
    if how == "sum" and flat and o.shape[0] == 1:
        # every reduced element has the same L and G: a subject's share is its count
        keys = o[0][o[0] >= 0]
        steps = np.diff(keys)
        most = 1 if (steps > 0).all() else (int(np.bincount(keys).max()) if keys.size else 0)
        sum_l, sum_g = reduce_array(s.L, shape, dims), reduce_array(s.G, shape, dims)
        pick = tuple(slice(0, 1) if d in dims else slice(None) for d in range(len(shape)))
        mixed = sum_g + most * np.maximum(lc[pick] - gc[pick], 0.0)
        single_r = single.reshape(out)
        kmost = np.broadcast_to(float(most), (max(nsub, 1),))
        if np.any(gc > 0):
            kmost = kfull
        return (
            owner.reshape(out),
            np.where(single_r, sum_l, mixed),
            np.where(single_r, sum_g, mixed),
            kmost,
        )
    L, G = (_to_rows(a, rshape, dims) for a in (s.L, s.G))
    if how == "sum":
        sum_l, sum_g = L.sum(axis=1), G.sum(axis=1)
        extra, kmax = _worst_subject(o, L - G, nsub)
        mixed = sum_g + np.maximum(extra, 0.0)
        if np.any(G > 0):
            kmax = kfull
        lo_l, lo_g = np.where(single, sum_l, mixed), np.where(single, sum_g, mixed)
    else:
        both = np.maximum(L, G).max(axis=1)
        lo_l = np.where(single, L.max(axis=1), both)
        lo_g = np.where(single, G.max(axis=1), both)
        kmax = kfull
    return owner.reshape(out), lo_l.reshape(out), lo_g.reshape(out), kmax


def _squeeze(a: Array, c: Ctx, dims: tuple[int, ...]) -> Array:
    a = np.asarray(a)
    if c.call.attrs.get("keepdim") or not dims or a.ndim == 0:
        return a
    return np.squeeze(a, axis=dims)


def _sum_like(c: Ctx, scale: float) -> State:
    x = c.arg(0)
    dims = dims_of(c, len(x.shape)) if x.shape else ()
    n = math.prod(x.shape[d] for d in dims)
    if math.prod(x.shape) == 0:  # an empty sum (or mean): the same on every dataset
        v = np.full(c.shape, 0.0 if c.node.op == "sum" else np.nan, dtype=c.meta.dtype.np)
        return public_state(v, c.meta.dtype)
    owner, L, G, kmax = aggregate(x, dims, c.nsub)
    lo, hi = reduce_array(x.lo, x.shape, dims), reduce_array(x.hi, x.shape, dims)
    sq = [_squeeze(a, c, dims) for a in (lo * scale, hi * scale, owner, L * scale, G * scale)]
    s = finish(c.meta, *sq)
    if has_joint(x):
        t1, t2 = joint(x, c.nsub)
        s = s.with_(t1=t1 * scale, t2=np.minimum(t2 * np.sqrt(kmax), t1) * scale)
    if x.table is not None and not any(
        varying_axes(x.table.root, x.shape, exact=True)[d] for d in dims
    ):
        t = x.table
        vals = reduce_array(t.vals, (*x.shape, t.size), dims) * scale
        root = np.broadcast_to(t.root, x.shape)[
            tuple(slice(0, 1) if d in dims else slice(None) for d in range(len(x.shape)))
        ]
        from dpnode.core.privacy.rules.unary import tighten

        vals = np.squeeze(vals, axis=dims) if not c.call.attrs.get("keepdim") else vals
        s = tighten(s, replace(t, root=_squeeze(root, c, dims), vals=vals.astype(c.meta.dtype.np)))
    from dpnode.core.privacy.rules.moments import moment_rule

    return moment_rule(c, x, dims, n, scale, s)


@rule("sum")
def sum_(c: Ctx) -> State:
    """Sum over dims."""
    return _sum_like(c, 1.0)


@rule("mean")
def mean(c: Ctx) -> State:
    """Mean over dims: the sum divided by the (public) count."""
    x = c.arg(0)
    dims = dims_of(c, len(x.shape)) if x.shape else ()
    n = math.prod(x.shape[d] for d in dims)
    return _sum_like(c, 1.0 / n if n else np.nan)


def _extreme(c: Ctx, fn: str, bool_out: bool) -> State:
    x = c.arg(0)
    dims = dims_of(c, len(x.shape)) if x.shape else ()
    if bool_out and math.prod(x.shape) == 0:
        # any of nothing is False and all of nothing True, on every dataset (a column of
        # empty rows: aggregating its owners raised ValueError)
        empty = np.full(c.shape, fn == "min", dtype=c.meta.dtype.np)
        return public_state(empty, c.meta.dtype)
    owner, L, G, _ = aggregate(x, dims, c.nsub, "max")
    if bool_out:
        # any/all test for nonzero: a jump, not 1-Lipschitz unless the input is bool
        lo, hi = np.zeros(()), np.ones(())
        L, G = np.where(L > 0, 1.0, 0.0), np.where(G > 0, 1.0, 0.0)
    else:
        lo = reduce_array(x.lo, x.shape, dims, fn)
        hi = reduce_array(x.hi, x.shape, dims, fn)
    s = finish(c.meta, *(_squeeze(a, c, dims) for a in (lo, hi, owner, L, G)))
    if has_joint(x) and (not bool_out or x.dtype.is_bool):
        t1, t2 = joint(x, c.nsub)
        s = s.with_(t1=t1, t2=t2)
    return s


_EXTREMES: dict[str, Callable[[Ctx], State]] = {
    "amax": lambda c: _extreme(c, "max", False),
    "amin": lambda c: _extreme(c, "min", False),
    "any": lambda c: _extreme(c, "max", True),
    "all": lambda c: _extreme(c, "min", True),
}


@rule(*_EXTREMES)
def extreme(c: Ctx) -> State:
    """amax/amin/any/all: the output moves at most as much as the element that moves most."""
    return _EXTREMES[c.node.op](c)


@rule("argmax", "argmin")
def argextreme(c: Ctx) -> State:
    """An index: jumps anywhere in its range as soon as a compared element may move."""
    x = c.arg(0)
    dim = c.call.attrs.get("dim")
    dims = tuple(range(len(x.shape))) if dim is None or not x.shape else (int(dim) % len(x.shape),)
    width = float(max(math.prod(x.shape[d] for d in dims) - 1, 0))
    owner, L, G, _ = aggregate(x, dims, c.nsub)
    L = np.where(L > 0, width, 0.0)
    G = np.where(G > 0, width, 0.0)
    z = np.zeros(np.shape(L))
    return finish(c.meta, *(_squeeze(a, c, dims) for a in (z, z + width, owner, L, G)))
