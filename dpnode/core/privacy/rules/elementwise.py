"""Rules of the binary elementwise prims, where, clamp and casts (and table propagation).

Each binary prim gives its result interval (interval arithmetic) and one factor per
argument bounding the result's change per unit change of that argument over the
argument intervals: 1 for add/sub/max/min/hypot, ``max|b|`` and ``max|a|`` for a
product, ``1/min|b|`` and ``max|a|/min|b|^2`` for a quotient whose divisor interval
excludes 0, ``inf`` for discontinuities (comparisons, logic, rounding divisions), which
``finish`` caps at the result's width. ``combine`` does the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from dpnode.core.engine import division
from dpnode.core.engine.prims import REGISTRY
from dpnode.core.engine.prims.elementwise import FLAT_EXPONENTS
from dpnode.core.engine.subnormals import flushing
from dpnode.core.privacy import partitions
from dpnode.core.privacy.arrays import pad_left, recompact
from dpnode.core.privacy.casts import ROOTS, Casts
from dpnode.core.privacy.rules.base import Ctx, combine, finish, rule
from dpnode.core.privacy.rules.moments import centred_tag
from dpnode.core.privacy.rules.unary import refuse_outside, tighten, widen
from dpnode.core.privacy.state import Array, State
from dpnode.core.privacy.tables import Table, make_root
from dpnode.core.privacy.thresholds import refine_all, threshold_table

__all__ = ["kernel_on_tables"]

INF = np.inf
Bin = tuple[Array, Array, Array | float, Array | float]


def _amax(s: State) -> Array:
    return np.maximum(np.abs(s.lo), np.abs(s.hi))


def _amin(s: State) -> Array:
    return np.where(s.lo > 0, s.lo, np.where(s.hi < 0, -s.hi, 0.0))


def _corners(a: State, blo: Array, bhi: Array) -> tuple[Array, Array]:
    ps = [a.lo * blo, a.lo * bhi, a.hi * blo, a.hi * bhi]
    return functools.reduce(np.minimum, ps), functools.reduce(np.maximum, ps)


def _add(c: Ctx, a: State, b: State) -> Bin:
    return a.lo + b.lo, a.hi + b.hi, 1.0, 1.0


def _sub(c: Ctx, a: State, b: State) -> Bin:
    return a.lo - b.hi, a.hi - b.lo, 1.0, 1.0


def _mul(c: Ctx, a: State, b: State) -> Bin:
    if c.refs[0] is not None and c.refs[0] == c.refs[1]:  # x * x: a square
        m = _amax(a)
        return _amin(a) ** 2, m * m, m, m
    lo, hi = _corners(a, b.lo, b.hi)
    return lo, hi, _amax(b), _amax(a)


def _div(c: Ctx, a: State, b: State) -> Bin:
    bmin = _amin(b)
    ok = bmin > 0
    safe = np.where(ok, bmin, 1.0)
    lo, hi = _corners(a, 1 / np.where(ok, b.hi, 1.0), 1 / np.where(ok, b.lo, 1.0))
    lo, hi = np.where(ok, lo, -INF), np.where(ok, hi, INF)
    # inf / inf and 0 / 0 are NaN: possible when both may be infinite, or both may be 0
    with np.errstate(invalid="ignore"):
        infinite = ~(np.isfinite(a.lo) & np.isfinite(a.hi)) & ~(
            np.isfinite(b.lo) & np.isfinite(b.hi)
        )
        zeros = (_amin(a) == 0) & ~ok
    nan = infinite | zeros
    lo, hi = np.where(nan, np.nan, lo), np.where(nan, np.nan, hi)
    # max|a| / min|b|^2 divided twice: min|b|^2 overflows (to inf, and the bound to 0) for
    # divisors above 1e154
    k_b = np.where(_amax(a) > 0, _positive(_amax(a) / safe / safe), 0.0)
    return lo, hi, np.where(ok, 1 / safe, INF), np.where(ok, k_b, INF)


def _positive(k: Array) -> Array:
    """A change factor that is positive in exact arithmetic, at least the smallest float: one
    that underflowed to 0 (``0.5 * (1e300)**-1.5``) would hide a change it multiplies (by
    up to 1e308) that is a float (``(1e300)**-0.5`` against ``(2e300)**-0.5``)."""
    return np.maximum(k, np.nextafter(0.0, 1.0))


def _extreme(fn: Callable[[Array, Array], Array]) -> Callable[[Ctx, State, State], Bin]:
    def r(c: Ctx, a: State, b: State) -> Bin:
        return fn(a.lo, b.lo), fn(a.hi, b.hi), 1.0, 1.0

    return r


def _hypot(c: Ctx, a: State, b: State) -> Bin:
    return np.hypot(_amin(a), _amin(b)), np.hypot(_amax(a), _amax(b)), 1.0, 1.0


def _indicator(c: Ctx, a: State, b: State) -> Bin:
    z = np.zeros(())
    return z, z + 1, INF, INF


def _bitwise(c: Ctx, a: State, b: State) -> Bin:
    if not c.meta.dtype.is_bool:
        raise c.fail("bitwise operations on private integers have no privacy rule")
    return _indicator(c, a, b)


def _public_divisor(c: Ctx, b: State) -> Array:
    if b.value is None or not np.all(np.asarray(b.value) != 0):
        raise c.fail("needs a public, nonzero divisor whose value is known")
    return np.asarray(b.value, dtype=np.float64)


def _check_quotient(c: Ctx, a: State, v: Array) -> None:
    """Refuse a float rounding division whose time could show a private dividend: the
    engine's constant-time kernels (:mod:`dpnode.core.engine.division`) need quotients below
    their cap and divisors in their range. Half the cap, on the bounds of the computed
    values; a dividend that is one value whatever the data takes one time."""
    if not c.meta.dtype.is_float or a.is_public:
        return
    cap = division.MAX_QUOTIENT[8 if c.meta.dtype.name == "float64" else 4] / 2
    low, high = division.DIVISOR_RANGE
    m = np.abs(v)
    with np.errstate(over="ignore"):
        reach = np.where((m >= low) & (m <= high), cap * m, np.nan)  # NaN: no dividend fits
    refuse_outside(
        c,
        a,
        -reach,
        reach,
        f"its kernel takes the same time whatever the values only for quotients up to "
        f"{cap:.0f} ({c.meta.dtype.name}) and divisors between 2^-900 and 2^900; this "
        "private dividend's bounds allow more, and the time of the answer would show "
        "private values. Clamp the dividend first",
    )


def _floor_div(c: Ctx, a: State, b: State) -> Bin:
    v = _public_divisor(c, b)
    if c.node.op == "floor_divide":
        _check_quotient(c, a, v)
    alo, ahi = widen(a.lo, a.hi, c.meta.dtype)
    ps = [alo / v, ahi / v]
    lo, hi = widen(np.minimum(*ps), np.maximum(*ps), c.meta.dtype)
    rnd = np.floor if c.node.op == "floor_divide" else np.trunc
    return rnd(lo), rnd(hi), INF, INF


def _remainder(c: Ctx, a: State, b: State) -> Bin:
    m = np.abs(_public_divisor(c, b))
    _check_quotient(c, a, m)
    if c.node.op == "remainder":  # sign follows the divisor
        v = np.asarray(b.value, dtype=np.float64)
        return np.where(v > 0, 0.0, -m), np.where(v > 0, m, 0.0), INF, INF
    return np.where(a.lo < 0, -m, 0.0), np.where(a.hi > 0, m, 0.0), INF, INF


#: ``|log|`` of the results the library's ``pow`` computes in the same time, by compute dtype
#: (float64, float32): as its ``exp`` (``python -m bench.side_channels --kernels``).
_POW_FLAT_LOG = {8: 700.0, 4: 80.0}


def _check_pow_timing(c: Ctx, a: State, p: float) -> None:
    """Refuse a private base that may lie where the library's ``pow`` is slow: at 0, below
    0, or where the result nears overflow or underflow (the exponents the engine computes
    with arithmetic, :data:`FLAT_EXPONENTS`, take one time anywhere)."""
    d = c.meta.dtype
    if not d.is_float or a.is_public or p in (0.0, 1.0):  # NumPy's own loops, not pow: flat
        return
    if p in FLAT_EXPONENTS and not d.is_low_precision:
        return
    edge = _POW_FLAT_LOG[8 if c.meta.dtype.name == "float64" else 4] / abs(p)
    lo, hi = float(np.exp(-edge)), float(np.exp(edge))
    refuse_outside(
        c,
        a,
        lo,
        hi,
        f"pow to {p:g} takes longer where the base is 0 or negative or the result nears "
        f"overflow or underflow, and this private base's bounds reach beyond [{lo:.6g}, "
        f"{hi:.6g}] ({c.meta.dtype.name}): the time of the answer would show private "
        "values. Clamp the base into that range first (in float32 and float64, the integer "
        "exponents from -16 to 16, 0.5 and -0.5 take one time for any base)",
    )


def _pow(c: Ctx, a: State, b: State) -> Bin:
    if b.value is None or b.value.ndim:
        raise c.fail(
            "pow needs a public scalar exponent (a private or tensor exponent has no rule)"
        )
    p = float(b.value)
    _check_pow_timing(c, a, p)
    if p == 0:
        one = np.ones(())
        return one, one, 0.0, 0.0
    m, n = _amax(a), _amin(a)
    if p.is_integer() and p > 0:
        if p % 2 == 0:
            lo, hi = n**p, m**p
        else:
            lo, hi = a.lo**p, a.hi**p
        return lo, hi, p * m ** (p - 1), 0.0
    # fractional or negative powers: monotone on the positive half-line only; a negative
    # base to a fractional power is NaN (NaN bounds, refused), a 0 to a negative one infinite
    ok = a.lo > 0 if p < 0 else a.lo >= 0
    with np.errstate(all="ignore"):
        ends = [np.where(ok, a.lo, 1.0) ** p, np.where(ok, a.hi, 1.0) ** p]
        slope = np.abs(p) * np.where(ok, n if p < 1 else m, 1.0) ** (p - 1)
    nan = np.asarray(a.lo < 0) & (not p.is_integer())
    lo = np.where(ok, np.minimum(*ends), np.where(nan, np.nan, -INF))
    hi = np.where(ok, np.maximum(*ends), np.where(nan, np.nan, INF))
    return lo, hi, np.where(ok, _positive(slope), INF), 0.0


_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
_BINARY: dict[str, Callable[[Ctx, State, State], Bin]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "div": _div,
    "maximum": _extreme(np.maximum),
    "minimum": _extreme(np.minimum),
    "hypot": _hypot,
    "pow": _pow,
    "floor_divide": _floor_div,
    "trunc_divide": _floor_div,
    "remainder": _remainder,
    "fmod": _remainder,
    **{n: _indicator for n in _COMPARISONS},
    **{n: _indicator for n in ("logical_and", "logical_or", "logical_xor")},
    **{n: _bitwise for n in ("bitwise_and", "bitwise_or", "bitwise_xor")},
}


def kernel_on_tables(c: Ctx, tables: list[Table | None]) -> Table | None:
    """Apply the prim's own kernel to the argument tables, if every private argument has one.

    ``tables[i]`` is argument ``i``'s table (None for public or absent arguments).
    All tables must share the same roots, element by element.
    """
    nd = len(c.shape)
    present = [t for t in tables if t is not None]
    kinds = {t.bps is None for t in present}
    if len(kinds) > 1:
        return None
    proto = present[0] if present else None
    if present and present[0].bps is not None:
        refined = refine_all(present)
        if refined is None:
            return None
        it = iter(refined)
        tables = [None if t is None else next(it) for t in tables]
        proto = refined[0]
    root: Array | None = None
    args: list[Any] = []
    for i, st in enumerate(c.args):
        t = tables[i] if i < len(tables) else None
        if st is None:
            args.append(None)
        elif t is not None:
            r = np.broadcast_to(pad_left(t.root, nd), c.shape)
            if root is None:
                root = r
            elif not np.array_equal(root, r):
                return None
            args.append(pad_left(t.vals, nd + 1))
        elif st.value is not None and st.is_public:
            # a value that repeats along an axis (a mean's gradient, 1/n on every row) enters
            # once along it: the kernel broadcasts it alike, and the table stays compact
            value = recompact(np.asarray(st.value))
            args.append(c.raw[i] if c.raw[i] is not None else pad_left(value, nd)[..., None])
        else:
            return None
    if root is None:
        return None
    try:  # in the engine's mode (its values to the bit: dpnode.core.engine.subnormals)
        with np.errstate(all="ignore"), flushing():
            vals = np.asarray(REGISTRY[c.node.op].kernel(c.call, args, None))
    except Exception:  # a kernel that cannot take the extra axis: no table, still sound
        return None
    if vals.ndim != nd + 1 or proto is None:
        return None
    return replace(proto, root=root, vals=vals)


def _finish_tables(c: Ctx, s: State) -> State:
    t = kernel_on_tables(c, [a.table if a is not None else None for a in c.args])
    return tighten(s, t) if t is not None else s


@rule(*_BINARY)
def binary(c: Ctx) -> State:
    """Binary elementwise prims: interval result and per-argument change factors."""
    a, b = c.arg(0), c.arg(1)  # (Python scalars cast as the kernel does: rounding.apply)
    with np.errstate(all="ignore"):
        lo, hi, ka, kb = _BINARY[c.node.op](c, a, b)
    owner, L, G = combine([a, b], [ka, kb], c.shape)
    s = _finish_tables(c, finish(c.meta, lo, hi, owner, L, G))
    if s.table is None and c.node.op in _COMPARISONS:
        for xi, x in ((0, a), (1, b)):
            t = threshold_table(c, x, xi)
            if t is not None:
                s = tighten(s, t)
                break
    part = _PARTITIONS[c.node.op](c, a, b) if c.node.op in _PARTITIONS else None
    if part is not None:
        s = s.with_(part=part)
    tag = centred_tag(c, a, b)
    return s if tag is None else s.with_(tag=tag)


#: the binary prims whose result may have partition axes (dpnode.core.privacy.partitions)
_PARTITIONS: dict[str, Callable[[Ctx, State, State], tuple[int, ...] | None]] = {
    "eq": lambda c, a, b: partitions.compared(c),
    "mul": partitions.product,
    "logical_and": partitions.product,
    "bitwise_and": partitions.product,
}


@rule("where")
def where(c: Ctx) -> State:
    """where(cond, a, b): a jump of the result's width when cond may flip, else 1-Lipschitz."""
    cond, a, b = c.arg(0), c.arg(1), c.arg(2)
    lo, hi = np.minimum(a.lo, b.lo), np.maximum(a.hi, b.hi)
    if cond.is_public and cond.value is not None:
        # a known mask picks each element's side (a causal mask's row keeps its finite
        # scores: its maximum is finite), but an element that would be one infinity exactly
        # keeps both sides' range: a width of inf - inf is no width the rules can use
        pick = np.asarray(cond.value, dtype=bool)
        with np.errstate(invalid="ignore"):
            plo, phi = np.where(pick, a.lo, b.lo), np.where(pick, a.hi, b.hi)
            single = np.isinf(plo) & (plo == phi)
        lo, hi = np.where(single, lo, plo), np.where(single, hi, phi)
    owner, L, G = combine([cond, a, b], [INF, 1.0, 1.0], c.shape)
    return _finish_tables(c, finish(c.meta, lo, hi, owner, L, G))


@rule("clamp")
def clamp(c: Ctx) -> State:
    """clamp(x, min, max): 1-Lipschitz in each of its arguments."""
    x = c.arg(0)
    given = [s for s in c.args if s is not None]
    lo, hi = x.lo, x.hi
    if c.args[1] is not None:
        lo, hi = np.maximum(lo, c.args[1].lo), np.maximum(hi, c.args[1].hi)
    if c.args[2] is not None:
        lo, hi = np.minimum(lo, c.args[2].lo), np.minimum(hi, c.args[2].hi)
    owner, L, G = combine(given, [1.0] * len(given), c.shape)
    return _finish_tables(c, finish(c.meta, lo, hi, owner, L, G))


@rule("convert_element_type")
def convert(c: Ctx) -> State:
    """Casts: identity to wider types, truncation to integers, ``x != 0`` to bool."""
    x = c.arg(0)
    d = c.meta.dtype
    lo, hi, L, G = x.lo, x.hi, np.asarray(x.L), np.asarray(x.G)
    if d.is_bool and not x.dtype.is_bool:
        lo, hi = np.zeros(()), np.ones(())
        L, G = np.where(L > 0, 1.0, 0.0), np.where(G > 0, 1.0, 0.0)
    elif not d.is_float and x.dtype.is_float:
        wlo, whi = widen(lo, hi, x.dtype)
        lo, hi = np.trunc(wlo), np.trunc(whi)
        L, G = np.where(L > 0, L + 1, 0.0), np.where(G > 0, G + 1, 0.0)
    # every cast maps zero to zero: a slice's one nonzero element stays the only one
    s = _finish_tables(c, finish(c.meta, lo, hi, x.owner, L, G, part=x.part))
    if s.table is None and not d.is_float:
        t = make_root(s, c.index)
        if t is not None:
            s = tighten(s, t)
    elif s.table is None and x.vid is not None and x.table is None:
        casts = _cast_of(c, x)
        if casts is not None:  # comparisons of the cast still cut the root
            s = s.with_(vid=x.vid, casts=casts)
    return s


def _cast_of(c: Ctx, x: State) -> Casts | None:
    """The chain of casts from ``x``'s root to this cast's values, for a cast to a float
    dtype of a root whose values the bisection enumerates (None otherwise)."""
    if x.casts is not None:
        return x.casts.then(c.call)
    if x.dtype.name not in ROOTS or x.E is not None:
        return None
    return Casts((c.call,), x.dtype.name, float(np.min(x.lo)), float(np.max(x.hi)))
