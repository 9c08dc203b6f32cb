"""Centred second moments (variance, covariance): a structured rule where intervals are blind.

Interval arithmetic cannot see that ``sum_i (x_i - mean(x))`` is zero, so through
``sum((x - x.mean()) ** 2)`` it charges every centred term for the shift of the mean:
about 3x the true sensitivity. This module recognises the pattern the SDK emits for
``var``/``cov`` (``mean(x, dims, keepdim)`` -> ``sub`` -> ``mul``/``pow 2`` -> ``sum``/``mean``
over the same dims) by tags the rules attach, and bounds the result directly:

For ``Q = sum_{i in R} (x_i - xbar)(y_i - ybar)`` over ``n`` rows whose values lie in
intervals of hull widths ``Wx``, ``Wy``, replacing one row changes ``Q`` by at most
``(n - 1)/n * Wx * Wy`` (proof in docs/sensitivity.md); a subject with ``k`` rows in ``R``
by ``k`` times that. The tags only *add* a second sound bound: the result is the
intersection with the generic one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from node.privacy.arrays import fit, reduce_array, varying_axes
from node.privacy.rules.base import Ctx
from node.privacy.state import PUBLIC, Array, State
from node.privacy.subjects import all_owned, rows_of, same_values

__all__ = ["Centred", "Comoment", "MeanOf", "centred_tag", "moment_rule"]


@dataclass(frozen=True, eq=False)
class MeanOf:
    """The state is ``mean(x, dims, keepdim)`` of the tensor at node ``src``."""

    src: int
    dims: tuple[int, ...]
    keepdim: bool
    x: State


@dataclass(frozen=True, eq=False)
class Centred:
    """The state is ``x - mean(x, dims)`` broadcast back over ``x``."""

    dims: tuple[int, ...]
    x: State


@dataclass(frozen=True, eq=False)
class Comoment:
    """The state is ``(x - mean(x)) * (y - mean(y))`` with both means over ``dims``."""

    dims: tuple[int, ...]
    x: State
    y: State


def centred_tag(c: Ctx, a: State, b: State) -> object:
    """The tag of a ``sub``/``mul``/``pow`` result, or None."""
    op = c.node.op
    ta, tb = a.tag, b.tag
    if op == "sub" and isinstance(tb, MeanOf) and c.refs[0] == tb.src and a.shape == c.shape:
        leading = tb.dims == tuple(range(len(tb.dims)))
        if tb.keepdim or leading:
            return Centred(tb.dims, tb.x)
    if (
        op == "mul"
        and isinstance(ta, Centred)
        and isinstance(tb, Centred)
        and ta.dims == tb.dims
        and a.shape == b.shape == c.shape == ta.x.shape == tb.x.shape
    ):
        return Comoment(ta.dims, ta.x, tb.x)
    square = b.value is not None and b.value.size == 1 and float(b.value.reshape(())) == 2.0
    if op == "pow" and isinstance(ta, Centred) and square and a.shape == ta.x.shape:
        return Comoment(ta.dims, ta.x, ta.x)
    return None


def _rows_ok(s: State) -> bool:
    if not np.all(s.G == 0):
        return False
    return all_owned(s.owner, s.shape) or bool(np.all((s.owner >= 0) | (s.owner == PUBLIC)))


def _counts(c: Ctx, owner: Array, shape: tuple[int, ...], dims: tuple[int, ...]) -> Array | None:
    """Per subject, how many of the elements summed into one output it owns (None: none owned).

    ``owner`` does not vary along the kept axes.
    """
    rows = rows_of(owner, shape)
    if rows is not None and rows.axis in dims:  # a subject column: its row counts
        per_row = math.prod(shape[d] for d in dims if d != rows.axis)
        sub = rows.subjects
        return sub.spread(sub.counts * float(per_row), max(c.nsub, 1))
    flat = np.broadcast_to(owner, shape)[
        tuple(slice(None) if d in dims else 0 for d in range(len(shape)))
    ].reshape(-1)
    priv = flat[flat >= 0]
    if priv.size == 0:
        return None
    return np.bincount(priv, minlength=c.nsub)[: max(c.nsub, 1)].astype(np.float64)


def moment_rule(c: Ctx, x: State, dims: tuple[int, ...], n: int, scale: float, s: State) -> State:
    """Tag a mean, or tighten a sum/mean of a comoment over its centring dims."""
    keep = bool(c.call.attrs.get("keepdim"))
    if c.node.op == "mean" and c.refs[0] is not None:
        s = s.with_(tag=MeanOf(c.refs[0], dims, keep, x))
    tag = x.tag
    if not isinstance(tag, Comoment) or tag.dims != dims or n < 1:
        return s
    cx, cy = tag.x, tag.y
    if not (_rows_ok(cx) and _rows_ok(cy)):
        return s
    ox = fit(cx.owner, x.shape)
    oy = fit(cy.owner, x.shape)
    if same_values(ox, oy):
        owner = ox
    elif np.all((ox == oy) | (ox == PUBLIC) | (oy == PUBLIC)):
        owner = np.where(ox == PUBLIC, oy, ox)
    else:
        return s
    keep_axes = [d for d in range(len(x.shape)) if d not in dims]
    if any(varying_axes(owner, x.shape, exact=True)[d] for d in keep_axes):
        return s  # the simple count below needs one subject layout for every output
    counts = _counts(c, owner, x.shape, dims)
    if counts is None:
        return s

    def hull(st: State) -> np.ndarray:
        # on the compact arrays (a column's bounds are one number), then broadcast to the
        # output's full shape: the per-output sums below must count every output
        hi = reduce_array(st.hi, x.shape, dims, "max")
        lo = reduce_array(st.lo, x.shape, dims, "min")
        width = np.asarray(hi - lo, dtype=np.float64)
        full = np.broadcast_to(width, tuple(1 if d in dims else m for d, m in enumerate(x.shape)))
        return full if keep else np.squeeze(full, axis=dims)

    wx, wy = hull(cx), hull(cy)
    per_row = (n - 1) / n * wx * wy * abs(scale)
    kmax = float(counts.max())
    bound = np.broadcast_to(kmax * per_row, c.shape)
    half = n * wx * wy / 4 * abs(scale)
    lo = np.zeros_like(half) if cx is cy else -half
    t1 = counts * float(per_row.sum())
    t2 = counts * float(math.sqrt(float((per_row**2).sum())))
    return s.with_(
        lo=np.maximum(s.lo, lo),
        hi=np.minimum(s.hi, half),
        L=np.minimum(s.L, bound),
        G=np.minimum(s.G, bound),
        t1=t1 if s.t1 is None else np.minimum(s.t1, t1),
        t2=t2 if s.t2 is None else np.minimum(s.t2, t2),
    )
