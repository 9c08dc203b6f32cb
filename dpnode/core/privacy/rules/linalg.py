"""The rule of matmul: a linear map when one side is public, a sum of products otherwise.

Three layouts are supported:

- *rows*: the private operand's owner is constant along the contracted axis (``X @ W``
  with one subject per row of ``X`` and public ``W``). Each output keeps its row's
  owner, with ``L = L_X @ |W|``; bounds are the exact image of the interval box.
- *contraction*: both operands' owners vary only along the contracted axis (``X.T @ X``,
  ``X.T @ y``, ``w @ X``). Each product term ``a_mk b_kn`` is bounded like a ``mul`` and
  the terms are summed like a ``sum`` over ``k``, in chunks of whole subjects so that
  the per-subject segment sums never straddle two chunks.
- *batched rows* (3-d and more): ``a[n] @ b[n]`` where batch row ``n`` of both operands
  belongs to one subject (per-example products): each output interval is the interval
  product, moved anywhere within it by that subject.
"""

from __future__ import annotations

import functools

import numpy as np

from node.privacy.arrays import fit, varying_axes
from node.privacy.rules.base import Ctx, finish, rule
from node.privacy.state import MIXED, PUBLIC, Array, State, has_joint, joint, mul0, public_state
from node.privacy.subjects import Rows, rows_of, same_values

__all__ = ["matmul"]

_CHUNK = 1 << 19
_BIG = np.iinfo(np.int64).max


def _2d(a: Array, shape: tuple[int, ...], left: bool) -> Array:
    f = fit(a, shape)
    if len(shape) == 2:
        return f
    return f.reshape(1, -1) if left else f.reshape(-1, 1)


def _as2d(s: State, left: bool) -> tuple[tuple[int, int], list[Array]]:
    """lo, hi, owner, L, G as fitted matrices (1-d: a left operand is a row, a right a column).

    Also returns the real matrix shape; a fitted matrix has size 1 where it is broadcast.
    """
    shape = s.shape
    row = (1, shape[0]) if left else (shape[0], 1)
    shape2 = row if len(shape) == 1 else (shape[0], shape[1])
    return shape2, [_2d(a, shape, left) for a in (s.lo, s.hi, s.owner, s.L, s.G)]


def _krows(a: Array, k: int) -> Array:
    """A fitted left matrix with its contracted (last) axis at full length ``k``."""
    return np.broadcast_to(a, (a.shape[0], k))


def _kcols(a: Array, k: int) -> Array:
    """A fitted right matrix with its contracted (first) axis at full length ``k``."""
    return np.broadcast_to(a, (k, a.shape[1]))


def _out(c: Ctx, r: Array, a: State, b: State) -> Array:
    """A fitted (m, n) result as an array broadcastable to the output shape."""
    if len(a.shape) == 1:
        r = r[0]
    if len(b.shape) == 1:
        r = r[..., 0]
    return r


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
    k = wshape[0] if x_left else wshape[1]
    lo, hi, L, G = (_krows(a, k) for a in (lo, hi, L, G))
    wlo, whi = _kcols(wlo, k), _kcols(whi, k)
    if wv is not None:
        wm, wr = wv, np.zeros_like(wv)
    else:
        with np.errstate(invalid="ignore"):  # unbounded weights: NaN, refused at the output
            wm, wr = (wlo + whi) / 2, (whi - wlo) / 2
    wabs = np.abs(wm) + wr
    mid, rad = (lo + hi) / 2, (hi - lo) / 2
    with np.errstate(all="ignore"):
        centre = mid @ wm
        radius = np.abs(mid) @ wr + rad @ np.abs(wm) + rad @ wr
        out_l, out_g = L @ wabs, G @ wabs
    owner = own[:, :1]
    res = [centre - radius, centre + radius, owner, out_l, out_g]
    if not x_left:
        res = [r.T for r in res]
    a, b = (x, w) if x_left else (w, x)
    s = finish(c.meta, *(_out(c, r, a, b) for r in res))
    if has_joint(x):
        t1, t2 = joint(x, c.nsub)
        row = float(wabs.sum(axis=1).max()) if wabs.size else 0.0
        big = wabs.size > 1 << 20
        spec = float(np.linalg.norm(wabs) if big else np.linalg.norm(wabs, 2))
        s = s.with_(t1=t1 * row, t2=t2 * spec)
    return s


def _axes(vary: list[bool]) -> list[int]:
    return [i for i, v in enumerate(vary) if v]


def _term_owner(oa: Array, ob: Array) -> Array:
    """Owner of ``a_k * b_k``: as in ``combine``, mixed factors do not take an owner away."""
    both = (oa >= 0) & (ob >= 0)
    owned = np.where(oa >= 0, oa, ob)
    anymixed = (oa == MIXED) | (ob == MIXED)
    return np.where(
        both & (oa != ob), MIXED, np.where(owned >= 0, owned, np.where(anymixed, MIXED, PUBLIC))
    )


def _terms(a: list[Array], b: list[Array], dif: Array | bool) -> tuple[Array, Array, Array, Array]:
    """Bounds, L and G of the product terms ``a[m, k] * b[k, n]``, shaped (m, k, n).

    ``a``/``b`` hold lo, hi, L, G; ``dif`` marks terms whose factors have different owners.
    """
    alo, ahi, aL, aG = (x[:, :, None] for x in a)
    blo, bhi, bL, bG = (x[None] for x in b)
    ps = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
    tlo, thi = functools.reduce(np.minimum, ps), functools.reduce(np.maximum, ps)
    ka = np.maximum(np.abs(blo), np.abs(bhi))
    kb = np.maximum(np.abs(alo), np.abs(ahi))
    same_l = mul0(ka, aL) + mul0(kb, bL)
    same_g = mul0(ka, aG) + mul0(kb, bG)
    cross = np.maximum(mul0(ka, aL) + mul0(kb, bG), mul0(ka, aG) + mul0(kb, bL))
    width = thi - tlo
    tl = np.minimum(np.where(dif, cross, same_l), width)
    tg = np.minimum(np.where(dif, cross, same_g), width)
    return tlo, thi, tl, tg


def _contract(c: Ctx, a: State, b: State) -> State:
    (m, k), (alo, ahi, aown, aL, aG) = _as2d(a, left=True)
    (_, n), (blo, bhi, bown, bL, bG) = _as2d(b, left=False)
    oa, ob = _krows(aown, k)[0], _kcols(bown, k)[:, 0]
    rows = _shared_rows(oa, ob, k)
    most: int | None = None
    if rows is not None:  # every term owned by its row's subject: no n-sized owner work
        o, differ, most = rows.subjects.column, np.zeros(k, dtype=bool), rows.subjects.max_rows
        # one subject owns every term, or the terms are mixed (two ids stand for "several")
        omin, omax = (int(o[0]), int(o[0])) if rows.subjects.max_rows == k else (0, 1)
    else:
        o = _term_owner(oa, ob)
        differ = (oa >= 0) & (ob >= 0) & (oa != ob)
        live = o[o != PUBLIC]
        omin = int(live.min()) if live.size else _BIG
        omax = int(live.max()) if live.size else -_BIG
    uniform_a = not any(varying_axes(x, a.shape, exact=True)[-1] for x in (a.lo, a.hi, a.L, a.G))
    uniform_b = not any(varying_axes(x, b.shape, exact=True)[0] for x in (b.lo, b.hi, b.L, b.G))
    if uniform_a and uniform_b:
        lo, hi, sum_l, sum_g, extra = _contract_uniform(
            [np.broadcast_to(x[:, :1], (m, 1)) for x in (alo, ahi, aL, aG)],
            [np.broadcast_to(x[:1], (1, n)) for x in (blo, bhi, bL, bG)],
            o,
            differ,
            most,
        )
    else:
        lo, hi, sum_l, sum_g, extra = _contract_chunks(
            [np.broadcast_to(x, (m, k)) for x in (alo, ahi, aL, aG)],
            [np.broadcast_to(x, (k, n)) for x in (blo, bhi, bL, bG)],
            o,
            differ,
            m,
            n,
        )
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


def _shared_rows(oa: Array, ob: Array, k: int) -> Rows | None:
    """The subject column both factors' owners follow along ``k`` (or one, the other public)."""
    for x, y in ((oa, ob), (ob, oa)):
        rows = rows_of(x, (k,))
        if rows is not None and (same_values(x, y) or bool(np.all(fit(y, (k,)) == PUBLIC))):
            return rows
    return None


def _contract_uniform(
    a: list[Array], b: list[Array], o: Array, differ: Array, most: int | None = None
) -> tuple[Array, Array, Array, Array, Array]:
    """Every term ``k`` has the same bounds: sums are counts times one term.

    ``most``: given when every term is owned and none by two subjects (a subject column),
    the most terms of one subject.
    """
    k = o.size
    tlo, thi, tl_same, tg_same = (t[:, 0] for t in _terms(a, b, False))
    _, _, cross, _ = (t[:, 0] for t in _terms(a, b, True))
    if most is not None:
        n_diff, n_same = 0, k
    else:
        pub = o == PUBLIC
        n_diff = int(differ.sum())
        n_same = int((~pub & ~differ).sum())
        same = ~pub & ~differ
        owners = o[same & (o >= 0)]
        most = int(np.bincount(owners).max()) if owners.size else 0
    sum_l = n_same * tl_same + n_diff * cross
    sum_g = n_same * tg_same + n_diff * cross
    extra = most * np.maximum(tl_same - tg_same, 0.0)
    return k * tlo, k * thi, sum_l, sum_g, extra


def _contract_chunks(
    a: list[Array], b: list[Array], o: Array, differ: Array, m: int, n: int
) -> tuple[Array, Array, Array, Array, Array]:
    """Terms in chunks of whole subjects, so segment sums never straddle two chunks."""
    k = o.size
    order = np.argsort(o, kind="stable")
    keys = o[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if k else np.zeros(0, int)
    step = max(1, _CHUNK // max(m * n, 1))
    lo, hi, sum_l, sum_g, extra = (np.zeros((m, n)) for _ in range(5))
    bounds = [*starts.tolist(), k]
    seg = 0
    while seg < len(bounds) - 1:
        end = seg + 1
        while end < len(bounds) - 1 and bounds[end] - bounds[seg] < step:
            end += 1
        ks = order[bounds[seg] : bounds[end]]
        cuts = np.asarray(bounds[seg:end]) - bounds[seg]
        tlo, thi, tl, tg = _terms(
            [x[:, ks] for x in a], [x[ks] for x in b], differ[ks][None, :, None]
        )
        lo += tlo.sum(axis=1)
        hi += thi.sum(axis=1)
        sum_l += tl.sum(axis=1)
        sum_g += tg.sum(axis=1)
        segs = np.add.reduceat(tl - tg, cuts, axis=1)
        priv = o[ks][cuts] >= 0
        if priv.any():
            extra = np.maximum(extra, segs[:, priv, :].max(axis=1))
        seg = end
    return lo, hi, sum_l, sum_g, extra


def _row_owner(s: State) -> Array | None:
    """The owner of each batch row (shape ``(rows or 1, 1, ..)``), if it is one per row."""
    if len(s.shape) < 3 or any(varying_axes(s.owner, s.shape, exact=True)[1:]):
        return None
    own = fit(s.owner, s.shape)
    return own[(slice(None),) + (slice(0, 1),) * (own.ndim - 1)]


def _batched_rows(c: Ctx, a: State, b: State) -> State:
    """``a[n] @ b[n]`` where each batch row ``n`` belongs to one subject in both operands
    (per-example products, e.g. a convolution's per-example weight gradients).

    Every term of ``out[n]`` is a product of row ``n``'s values, so its interval is the
    interval product ``mid_a @ mid_b +- (|mid_a| @ rad_b + rad_a @ |mid_b| + rad_a @ rad_b)``,
    replacing the row's subject moves it anywhere in that interval (``L`` is its width), and
    another subject moves it by ``|a| @ G_b + G_a @ |b| + G_a @ G_b`` at most.
    """
    oa, ob = _row_owner(a), _row_owner(b)
    same_batch = len(a.shape) == len(b.shape) and a.shape[:-2] == b.shape[:-2]
    if oa is None or ob is None or not same_batch:
        raise c.fail(
            f"batched matmul of {list(a.shape)} by {list(b.shape)}: needs both operands "
            "batched alike, each batch row belonging to one subject"
        )
    pub_a, pub_b = bool(np.all(oa == PUBLIC)), bool(np.all(ob == PUBLIC))
    rows = np.broadcast_shapes(oa.shape, ob.shape)
    if not (pub_a or pub_b or np.array_equal(np.broadcast_to(oa, rows), np.broadcast_to(ob, rows))):
        raise c.fail("batched matmul: the two operands' rows belong to different subjects")
    owner = ob if pub_a else oa
    k = a.shape[-1]

    def full_k(x: Array, shape: tuple[int, ...], axis: int) -> Array:
        f = fit(x, shape)
        want = list(f.shape)
        want[axis] = k
        return np.broadcast_to(f, want)

    alo, ahi, aG = (full_k(x, a.shape, -1) for x in (a.lo, a.hi, a.G))
    blo, bhi, bG = (full_k(x, b.shape, -2) for x in (b.lo, b.hi, b.G))
    with np.errstate(all="ignore"):
        am, ar = (alo + ahi) / 2, (ahi - alo) / 2
        bm, br = (blo + bhi) / 2, (bhi - blo) / 2
        centre = am @ bm
        radius = np.abs(am) @ br + ar @ np.abs(bm) + ar @ br
        amag, bmag = np.maximum(np.abs(alo), np.abs(ahi)), np.maximum(np.abs(blo), np.abs(bhi))
        G = mul0(1.0, amag @ bG) + mul0(1.0, aG @ bmag) + mul0(1.0, aG @ bG)
    L = np.full((1,) * len(c.shape), np.inf)  # anywhere in the interval: finish caps it
    return finish(c.meta, centre - radius, centre + radius, owner, L, G)


@rule("matmul")
def matmul(c: Ctx) -> State:
    """Matrix products of 1-d and 2-d operands (see the module docstring)."""
    a, b = c.arg(0), c.arg(1)
    if 0 in a.shape or 0 in b.shape:  # empty sums: zeros whatever the data
        return public_state(np.zeros(c.shape, dtype=c.meta.dtype.np), c.meta.dtype)
    if len(a.shape) > 2 or len(b.shape) > 2:
        return _batched_rows(c, a, b)
    ka = varying_axes(a.owner, a.shape, exact=True)
    kb = varying_axes(b.owner, b.shape, exact=True)
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
        f"matmul of {list(a.shape)} by {list(b.shape)}: needs one public operand, or both "
        "operands' subjects to vary along the contracted axis only "
        f"(subjects vary along axes {_axes(ka)} and {_axes(kb)})"
    )
