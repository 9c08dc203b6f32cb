"""Threshold tables: histograms of float (and wide integer) columns built by comparisons.

A comparison of a private float scalar ``x`` with public thresholds is a step function
of ``x``. Cut the real line at the sorted thresholds ``b_0 < ... < b_{m-1}`` into the
pieces ``(-inf, b_0), {b_0}, (b_0, b_1), ..., {b_{m-1}}, (b_{m-1}, inf)``: every result
of comparing ``x`` with thresholds among the ``b_i`` is constant on each piece, and so
is anything computed elementwise from such results. Evaluating the engine's kernel on
one representable value of ``x`` per piece therefore gives the function everywhere,
and the joint change of all elements depending on the same ``x`` is an exact maximum
over pairs of pieces (see :mod:`dpnode.core.privacy.tables`).

Soundness needs the comparison to see ``x`` exactly: for a float ``x`` the compare dtype
must be a float at least as wide (float16 compares in float32; bfloat16 roots are not
tabulated); for an integer ``x`` an integer dtype, or a float whose mantissa holds every
value in ``x``'s bounds. The thresholds are taken as the kernel converts them.
Two tables of the same root with different cuts are refined to the union of the cuts:
a value on a new piece is the value of the old piece containing it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dpnode.core.engine.dtypes import opmath
from dpnode.core.engine.prims import REGISTRY
from dpnode.core.engine.prims.elementwise import as_np, operands_of
from dpnode.core.engine.promotion import result_type
from dpnode.core.engine.subnormals import flushing
from dpnode.core.privacy.arrays import pad_left
from dpnode.core.privacy.rules.base import Ctx
from dpnode.core.privacy.state import Array, State
from dpnode.core.privacy.tables import MAX_DOMAIN, Table, ids_of

__all__ = ["piece_of", "pieces", "refine_all", "threshold_table"]

_WIDTH = {"float16": 0, "float32": 1, "float64": 2}
_MANTISSA = {"float16": 11, "float32": 24, "float64": 53}


def _next_up(v: float, dt: np.dtype[Any]) -> float:
    """The smallest value of ``dt`` strictly above ``v``.

    >>> _next_up(0.1, np.dtype("float32")) > 0.1
    True
    >>> _next_up(2.0, np.dtype("int64"))
    3.0
    """
    if dt.kind in "iu":
        return float(np.floor(v) + 1)
    r = dt.type(v)
    if float(r) <= v:
        r = np.nextafter(r, dt.type(np.inf))
    return float(r)


def _inside(lo: float, hi: float, dt: np.dtype[Any]) -> tuple[float, float]:
    """``[lo, hi]`` shrunk to values of ``dt`` (every root value is one).

    >>> _inside(0.1, 0.2, np.dtype("float32"))[0] >= 0.1
    True
    """
    if dt.kind in "iu":
        return float(np.ceil(lo)), float(np.floor(hi))
    with np.errstate(all="ignore"):
        a, b = dt.type(lo), dt.type(hi)
        if float(a) < lo:
            a = np.nextafter(a, dt.type(np.inf))
        if float(b) > hi:
            b = np.nextafter(b, dt.type(-np.inf))
    return float(a), float(b)


def _holds(dt: np.dtype[Any], v: float) -> bool:
    """Whether ``v`` is a value of ``dt``.

    >>> _holds(np.dtype("float32"), 0.1), _holds(np.dtype("int64"), 3.0)
    (False, True)
    """
    return v.is_integer() if dt.kind in "iu" else float(dt.type(v)) == v


def pieces(bps: Array, lo: float, hi: float, dt: np.dtype[Any]) -> tuple[Array, Array]:
    """One value of ``dt`` in ``[lo, hi]`` per piece cut at ``bps``, and which pieces have one.

    ``lo`` and ``hi`` must be values of ``dt``; pieces without a value get ``lo`` (ignored).

    >>> reps, ok = pieces(np.array([1.0]), 0.0, 2.0, np.dtype("float64"))
    >>> reps.tolist(), ok.tolist()
    ([0.0, 1.0, 1.0000000000000002], [True, True, True])
    """
    m = len(bps)
    reps = np.full(2 * m + 1, lo)
    ok = np.zeros(2 * m + 1, dtype=bool)
    edges = [-np.inf, *bps.tolist(), np.inf]
    for i in range(m + 1):
        left, right = edges[i], edges[i + 1]
        r = lo if left == -np.inf else max(_next_up(left, dt), lo)
        if r < right and r <= hi:
            reps[2 * i], ok[2 * i] = r, True
        if i < m and lo <= bps[i] <= hi and _holds(dt, float(bps[i])):
            reps[2 * i + 1], ok[2 * i + 1] = bps[i], True
    return reps, ok


def piece_of(points: Array, bps: Array) -> Array:
    """Index of the piece (cut at ``bps``) that contains each point.

    >>> piece_of(np.array([0.5, 1.0, 1.5]), np.array([1.0])).tolist()
    [0, 1, 2]
    """
    i = np.searchsorted(bps, points, side="left")
    if not len(bps):
        return np.zeros(np.shape(points), dtype=np.int64)
    exact = (i < len(bps)) & (bps[np.minimum(i, len(bps) - 1)] == points)
    return np.where(exact, 2 * i + 1, 2 * i)


def refine_all(tables: list[Table]) -> list[Table] | None:
    """The float tables re-expressed on the union of their cuts (None if not one root kind)."""
    spans = {t.span for t in tables}
    if len(spans) != 1 or None in spans:
        return None
    (span,) = spans
    assert span is not None
    lo, hi, name = span
    cuts = [t.bps for t in tables if t.bps is not None]
    bps = np.unique(np.concatenate(cuts)) if cuts else np.zeros(0)
    if len(bps) > MAX_DOMAIN:
        return None
    reps, ok = pieces(bps, lo, hi, np.dtype(name))
    out = []
    for t in tables:
        assert t.bps is not None
        out.append(
            replace(
                t, vals=np.take(t.full_vals(), piece_of(reps, t.bps), axis=-1), bps=bps, valid=ok
            )
        )
    return out


def _exact(root: str, compare: str, magnitude: float) -> bool:
    """Whether comparing in dtype ``compare`` sees every value of the root exactly.

    >>> _exact("float32", "float64", 1e30), _exact("int64", "float32", 2.0**30)
    (True, False)
    """
    if root in _WIDTH:
        return compare in _WIDTH and _WIDTH[compare] >= _WIDTH[root]
    if root.startswith(("int", "uint")):
        if compare.startswith(("int", "uint")):
            return True
        return compare in _MANTISSA and magnitude <= 2.0 ** _MANTISSA[compare]
    return False


def threshold_table(c: Ctx, x: State, xi: int) -> Table | None:
    """The table of comparing root ``x`` (argument ``xi``) with public thresholds, if exact."""
    oi = 1 - xi
    other = c.args[oi]
    if x.vid is None or x.table is not None or other is None or not other.is_public:
        return None
    raw = c.raw[oi] if c.raw[oi] is not None else other.value
    if raw is None:
        return None
    cd = opmath(result_type(operands_of(c.call)))
    casts = x.casts
    root = np.dtype(casts.root) if casts is not None else x.dtype.np
    span = (casts.lo, casts.hi) if casts is not None else (np.min(x.lo), np.max(x.hi))
    lo, hi = _inside(float(span[0]), float(span[1]), root)
    if not np.isfinite([lo, hi]).all():
        return None
    if casts is not None:  # cut where the casts of the root cross each threshold
        if max(-lo, hi) >= 2.0**53:
            return None
        thresholds = np.unique(np.asarray(as_np(raw, cd)).ravel())
        if len(thresholds) > MAX_DOMAIN:
            return None
        bps = np.unique(casts.cuts(thresholds, cd, lo, hi))
    elif not _exact(x.dtype.name, cd.name, max(-lo, hi)):
        return None
    else:
        bps = np.unique(np.asarray(as_np(raw, cd), dtype=np.float64))
    if len(bps) > MAX_DOMAIN or not (np.isfinite(bps).all() and np.abs(bps).max(initial=0) < 2**53):
        return None
    reps, ok = pieces(bps, lo, hi, root)
    nd = len(c.shape)
    args: list[Any] = [None, None]
    values = reps.astype(root)
    args[xi] = pad_left(values if casts is None else casts.apply(values), nd + 1)
    args[oi] = c.raw[oi] if c.raw[oi] is not None else pad_left(np.asarray(raw), nd)[..., None]
    with flushing():  # in the engine's mode (its values to the bit)
        vals = np.asarray(REGISTRY[c.node.op].kernel(c.call, args, None))
    ids = pad_left(ids_of(x.vid), nd)
    return Table(ids, vals, bps, ok, (lo, hi, root.name))
