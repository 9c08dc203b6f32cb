"""The rule of matmul: a linear map when one side is public, a sum of products otherwise.

Two layouts are supported (1-d and 2-d operands; batched private products have no rule):

- *rows*: the private operand's owner is constant along the contracted axis (``X @ W``
  with one subject per row of ``X`` and public ``W``). Each output keeps its row's
  owner, with ``L = L_X @ |W|``; bounds are the exact image of the interval box.
- *contraction*: both operands' owners vary only along the contracted axis (``X.T @ X``,
  ``X.T @ y``, ``w @ X``). Each product term ``a_mk b_kn`` is bounded like a ``mul`` and
  the terms are summed like a ``sum`` over ``k``, in chunks of whole subjects so that
  the per-subject segment sums never straddle two chunks.
"""

from __future__ import annotations

import numpy as np

from node.privacy.arrays import varying_axes
from node.privacy.rules.base import Ctx, finish, rule
from node.privacy.state import MIXED, PUBLIC, Array, State, has_joint, joint, mul0

__all__ = ["matmul"]

_CHUNK = 1 << 19
_BIG = np.iinfo(np.int64).max


def _as2d(s: State, left: bool) -> tuple[tuple[int, int], list[Array]]:
    """lo, hi, owner, L, G as matrices (a 1-d left operand is a row, a right one a column)."""
    shape = s.shape
    row = (1, shape[0]) if left else (shape[0], 1)
    shape2 = row if len(shape) == 1 else (shape[0], shape[1])
    arrs = [np.broadcast_to(a, s.shape).reshape(shape2) for a in (s.lo, s.hi, s.owner, s.L, s.G)]
    return shape2, arrs


def _linear(c: Ctx, x: State, w: State, x_left: bool) -> State:
    """``x @ w`` (or ``w @ x``) with ``w`` public and ``x``'s owner constant along k.

    ``w @ x`` is computed as ``(x.T @ w.T).T``.
    """
    _, (lo, hi, own, L, G) = _as2d(x, left=x_left)
    wshape, (wlo, whi, _, _, _) = _as2d(w, left=not x_left)
    wv = None if w.value is None else np.asarray(w.value, dtype=np.float64).reshape(wshape)
    if not x_left:
        lo, hi, own, L, G = (a.T for a in (lo, hi, own, L, G))
        wlo, whi = wlo.T, whi.T
        wv = None if wv is None else wv.T
    if wv is not None:
        wm, wr = wv, np.zeros_like(wv)
    else:
        wm, wr = (wlo + whi) / 2, (whi - wlo) / 2
    wabs = np.abs(wm) + wr
    mid, rad = (lo + hi) / 2, (hi - lo) / 2
    with np.errstate(all="ignore"):
        centre = mid @ wm
        radius = np.abs(mid) @ wr + rad @ np.abs(wm) + rad @ wr
        out_l, out_g = L @ wabs, G @ wabs
    owner = np.broadcast_to(own[:, :1], centre.shape)
    res = [centre - radius, centre + radius, owner, out_l, out_g]
    if not x_left:
        res = [r.T for r in res]
    s = finish(c.meta, *(np.reshape(r, c.shape) for r in res))
    if has_joint(x):
        t1, t2 = joint(x, c.nsub)
        row = float(wabs.sum(axis=1).max()) if wabs.size else 0.0
        big = wabs.size > 1 << 20
        spec = float(np.linalg.norm(wabs) if big else np.linalg.norm(wabs, 2))
        s = s.with_(t1=t1 * row, t2=t2 * spec)
    return s


def _term_owner(oa: Array, ob: Array) -> Array:
    same = (oa == ob) | (ob == PUBLIC)
    return np.where(same, oa, np.where(oa == PUBLIC, ob, MIXED))


def _contract(c: Ctx, a: State, b: State) -> State:
    (m, k), (alo, ahi, aown, aL, aG) = _as2d(a, left=True)
    (_, n), (blo, bhi, bown, bL, bG) = _as2d(b, left=False)
    oa, ob = aown[0], bown[:, 0]
    o = _term_owner(oa, ob)
    differ = (oa != ob) & (oa != PUBLIC) & (ob != PUBLIC)
    order = np.argsort(o, kind="stable")
    keys = o[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if k else np.zeros(0, int)
    step = max(1, _CHUNK // max(m * n, 1))
    lo = np.zeros((m, n))
    hi = np.zeros((m, n))
    sum_l = np.zeros((m, n))
    sum_g = np.zeros((m, n))
    extra = np.zeros((m, n))
    bounds = [*starts.tolist(), k]
    seg = 0
    while seg < len(bounds) - 1:
        end = seg + 1
        while end < len(bounds) - 1 and bounds[end] - bounds[seg] < step:
            end += 1
        ks = order[bounds[seg] : bounds[end]]
        cuts = np.asarray(bounds[seg:end]) - bounds[seg]
        xl, xh = alo[:, ks][:, :, None], ahi[:, ks][:, :, None]
        yl, yh = blo[ks][None], bhi[ks][None]
        ps = [xl * yl, xl * yh, xh * yl, xh * yh]
        tlo, thi = np.minimum.reduce(ps), np.maximum.reduce(ps)
        ka = np.maximum(np.abs(yl), np.abs(yh))
        kb = np.maximum(np.abs(xl), np.abs(xh))
        la, ga = aL[:, ks][:, :, None], aG[:, ks][:, :, None]
        lb, gb = bL[ks][None], bG[ks][None]
        same_l = mul0(ka, la) + mul0(kb, lb)
        same_g = mul0(ka, ga) + mul0(kb, gb)
        cross = np.maximum(mul0(ka, la) + mul0(kb, gb), mul0(ka, ga) + mul0(kb, lb))
        dif = differ[ks][None, :, None]
        width = thi - tlo
        tl = np.minimum(np.where(dif, cross, same_l), width)
        tg = np.minimum(np.where(dif, cross, same_g), width)
        lo += tlo.sum(axis=1)
        hi += thi.sum(axis=1)
        sum_l += tl.sum(axis=1)
        sum_g += tg.sum(axis=1)
        segs = np.add.reduceat(tl - tg, cuts, axis=1)
        priv = o[ks][cuts] >= 0
        if priv.any():
            extra = np.maximum(extra, segs[:, priv, :].max(axis=1))
        seg = end
    live = o[o != PUBLIC]
    omin = int(live.min()) if live.size else _BIG
    omax = int(live.max()) if live.size else -_BIG
    if omin == _BIG:
        owner = PUBLIC
        L = G = np.zeros((m, n))
    elif omin == omax and omin >= 0:
        owner, L, G = omin, sum_l, sum_g
    else:
        owner = MIXED
        L = G = sum_g + np.maximum(extra, 0.0)
    res = [lo, hi, np.full((m, n), owner, dtype=np.int64), L, G]
    return finish(c.meta, *(np.reshape(r, c.shape) for r in res))


@rule("matmul")
def matmul(c: Ctx) -> State:
    """Matrix products of 1-d and 2-d operands (see the module docstring)."""
    a, b = c.arg(0), c.arg(1)
    if len(a.shape) > 2 or len(b.shape) > 2:
        raise c.fail("batched matmul of private tensors has no privacy rule")
    ka = varying_axes(a.owner, a.shape)
    kb = varying_axes(b.owner, b.shape)
    # a's contracted axis is its last, b's its first (for 1-d operands, their only axis)
    a_rows = not ka[-1]  # owner constant along k
    b_cols = not kb[0]
    a_k = len(a.shape) == 1 or not ka[0]  # owner varies along k only
    b_k = len(b.shape) == 1 or not kb[1]
    if b.is_public and a_rows:
        return _linear(c, a, b, True)
    if a.is_public and b_cols:
        return _linear(c, b, a, False)
    if a_k and b_k:
        return _contract(c, a, b)
    raise c.fail(
        "matmul needs one public operand, or both operands' subjects to vary along the "
        "contracted axis only"
    )
