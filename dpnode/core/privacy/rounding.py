"""Floating-point rounding: how far the engine's results can be from exact arithmetic.

The rules bound the change of the *exact* query: each prim applied in real arithmetic
to its arguments. The engine computes in floating point, so what is released is
``f~(D)``, not ``f(D)``. This module tracks, per element, a bound ``E`` on
``|f~(D) - f(D)|`` valid on every dataset within the declared bounds; the release
then pays for ``|f~(D) - f~(D')| <= |f(D) - f(D')| + 2E`` (see
:meth:`dpnode.core.privacy.tracker.PrivacyTracker.report`). Per prim (:func:`apply`):

- ``E`` of the arguments is carried through the prim: the prim's own rule, applied to
  states where every element may move by its ``E`` at once (owner ``MIXED``, ``L = G =
  E``) over the interval holding both the exact and the computed values, bounds how far
  the result of computed arguments is from the result of exact ones;
- the prim's own rounding is added: none for moves, selections, ``abs``, ``clamp`` and
  the like; half an ulp of the operation dtype plus half an ulp of the result dtype for
  the correctly rounded ``+ - * /``, ``sqrt`` and casts; ``LIBM_ULPS`` ulps for the
  library functions (``exp``, ``log``, ``tanh``, ...); ``gamma(n) * sum |x|`` for a
  float sum of ``n`` terms or a contraction of length ``n`` (Higham, *Accuracy and
  Stability of Numerical Algorithms*, 2nd ed., section 3.1), in the dtype the engine
  accumulates in (float64 in tracked evaluations, :func:`dpnode.core.engine.dtypes.accumulation`);
- a discontinuous prim (comparisons, ``floor``, casts to integers, ``argmax``) or one
  whose rule holds for any argument values (``clip_by_subject_norm``) is applied to the
  *computed* arguments instead: each argument's ``E`` is folded into its bounds and
  changes (:func:`fold`), and the result starts exact again. An element whose rule says
  it does not move when other subjects change (``G == 0``) is computed from the same
  bits on both datasets, so folding adds ``2E`` to ``L`` everywhere but to ``G`` only
  where it was already positive.

Integer and boolean results are exact (wrap-around is the rules' business).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dpnode.core.engine.accurate import depth
from dpnode.core.engine.dtypes import DType, accumulation, opmath
from dpnode.core.engine.prims.dpsgd import part_arguments
from dpnode.core.engine.prims.elementwise import BINARY_PRIMS, operands_of
from dpnode.core.engine.prims.linalg import conv_geometry, matmul_accumulation
from dpnode.core.engine.promotion import result_type
from dpnode.core.privacy.arrays import fit, reduce_array
from dpnode.core.privacy.rules.base import Ctx, Rule, largest_finite
from dpnode.core.privacy.rules.conv import magnitude_terms
from dpnode.core.privacy.rules.reductions import dims_of
from dpnode.core.privacy.state import MIXED, PUBLIC, Array, State, public_state
from dpnode.core.privacy.subjects import rows_of
from dpnode.core.privacy.tables import LazyIds

__all__ = ["LIBM_ULPS", "apply", "fold", "gamma", "tiny", "unit"]

#: ulps of the result a library function (NumPy's or SciPy's ``exp``, ``log``, ``erf``,
#: ...) may be off by; their documented errors are at most a few ulps
LIBM_ULPS = 32

#: unit roundoff (half an ulp of 1), and the smallest normal per float dtype: the engine
#: flushes results that would be subnormal to zero (dpnode.core.engine.subnormals), so a
#: rounding may be off by that much in absolute terms (or by the smallest subnormal's half,
#: where the platform cannot flush: less)
_UNIT = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_TINY = {"float64": 2.0**-1022, "float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126}
#: integers a float dtype holds exactly (up to 2**p)
_EXACT_INT = {"float64": 2.0**53, "float32": 2.0**24, "float16": 2.0**11, "bfloat16": 2.0**8}
#: float casts that keep every value
_WIDENING = {
    ("float16", "float32"),
    ("float16", "float64"),
    ("bfloat16", "float32"),
    ("bfloat16", "float64"),
    ("float32", "float64"),
}

#: prims whose float result is one of their arguments' values, moved or selected
EXACT = frozenset(
    {
        "abs", "amax", "amin", "cat", "clamp", "expand", "flip", "gather", "index",
        "index_select", "maximum", "minimum", "neg", "pad", "permute", "rand", "reshape",
        "slice", "squeeze", "unfold", "unsqueeze", "where",
    }
)  # fmt: skip
#: correctly rounded: one rounding in the operation dtype, one to the result dtype
ONCE = frozenset({"add", "sub", "mul", "div", "sqrt", "reciprocal"})
#: library functions, accurate to ``LIBM_ULPS`` ulps
LIBM = frozenset(
    {
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "erf", "erfc",
        "exp", "exp2", "expm1", "hypot", "log", "log10", "log1p", "log2", "pow",
        "rsqrt", "sin", "sinh", "tanh",
    }
)  # fmt: skip
#: library functions that are never negative (so neither is their computed value)
_NONNEG = frozenset({"acosh", "cosh", "erfc", "exp", "exp2", "hypot", "rsqrt", "sqrt"})
#: discontinuous prims with a float result; their rules hold for computed arguments.
#: ``fmod`` is exact; the others may be one rounding (``remainder``) or one unit
#: (``floor_divide``: ``1 // 0.1 == 9``) off the exact value
STEPS = {
    "ceil": 0.0, "floor": 0.0, "round": 0.0, "sign": 0.0, "trunc": 0.0, "fmod": 0.0,
    "remainder": math.nan, "floor_divide": 1.0, "trunc_divide": 1.0,
}  # fmt: skip
#: prims whose rule bounds the change for any argument values: no error carried in
RESETS = frozenset({"clip_by_subject_norm"})
ACCUMULATE = frozenset({"sum", "mean", "matmul"})


def unit(dt: DType) -> float:
    """Unit roundoff of a float dtype (0 for integers and bool, which are exact)."""
    return _UNIT.get(dt.name, 0.0)


def tiny(dt: DType) -> float:
    """The absolute error one rounding of a float dtype may add: its smallest normal, as
    results below it are flushed to zero (0 for integers and bool)."""
    return _TINY.get(dt.name, 0.0)


def gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error of ``n`` roundings."""
    nu = n * u
    return nu / (1.0 - nu) if nu < 0.5 else math.inf


def _magnitude(lo: Array, hi: Array) -> Array:
    with np.errstate(invalid="ignore"):
        return np.asarray(np.maximum(np.abs(lo), np.abs(hi)))


def wide(s: State) -> tuple[Array, Array]:
    """An interval holding both the exact and the computed values of ``s``."""
    if s.E is None:
        return s.lo, s.hi
    assert s.clo is not None and s.chi is not None
    return np.minimum(s.lo, s.clo), np.maximum(s.hi, s.chi)


def _owners(s: State) -> tuple[Array | bool, Array | bool, Array | bool]:
    """Masks of the owned, public and mixed elements; a subject column stays compact."""
    if rows_of(s.owner, s.shape) is not None:
        return True, False, False
    owned = s.owner >= 0
    if owned.all():  # every element owned (rows moved by a view): masks stay scalars
        return True, False, False
    return owned, s.owner == PUBLIC, s.owner == MIXED


def spread(s: State, E: Array) -> tuple[float, float]:
    """L1 and L2 norms of ``E`` over the elements of ``s`` that some subject can move."""
    mask = np.logical_not(_owners(s)[1])
    with np.errstate(all="ignore"):
        e = np.where(mask, E, 0.0)
        everything = tuple(range(len(s.shape)))
        r1 = float(reduce_array(e, s.shape, everything).sum())
        # scaled by the largest, so that errors near the smallest normal do not vanish in
        # their squares (an L2 rounding of 2^-1022 was counted as 0)
        top = float(np.max(e)) if np.size(e) else 0.0
        if top == 0.0 or not math.isfinite(top):
            r2 = top
        else:
            scaled = e / top
            r2 = top * float(np.sqrt(reduce_array(scaled * scaled, s.shape, everything).sum()))
    return (r1 if not math.isnan(r1) else math.inf), (r2 if not math.isnan(r2) else math.inf)


def fold(s: State | None) -> State | None:
    """The state of the *computed* tensor: its rounding error moved into bounds and changes."""
    if s is None or s.E is None:
        return s
    E = s.E
    lo, hi = wide(s)
    _, pub, mixed = _owners(s)
    with np.errstate(all="ignore"):
        width = hi - lo
        L = np.where(pub, 0.0, np.minimum(s.L + 2 * E, width))
        G = np.where(s.G > 0, np.minimum(s.G + 2 * E, width), 0.0)
        if np.any(mixed):
            L = np.where(mixed, np.maximum(L, G), L)
            G = np.where(mixed, np.maximum(L, G), G)
    t1, t2 = s.t1, s.t2
    if t1 is not None or t2 is not None:
        r1, r2 = spread(s, E)
        t1 = None if t1 is None else t1 + 2 * r1
        t2 = None if t2 is None else t2 + 2 * r2
    return replace(
        s,
        lo=fit(lo, s.shape),
        hi=fit(hi, s.shape),
        L=fit(L, s.shape),
        G=fit(G, s.shape),
        t1=t1,
        t2=t2,
        table=None,
        vid=_computed_ids(s),
        tag=None,
        E=None,
        clo=None,
        chi=None,
    )


def _computed_ids(s: State) -> Array | LazyIds | None:
    """The value ids a state keeps once its rounding is accounted for: those of a cast's
    values, which name the engine's computed casts of their root (the casts' own rounding
    is what :mod:`dpnode.core.privacy.casts` cuts the root by), and no others."""
    return s.vid if s.casts is not None else None


def _perturbation(s: State | None) -> State | None:
    """A state whose every element may move by its ``E`` at once (mixed), over ``wide(s)``."""
    if s is None or (s.E is None and s.is_public):
        return s
    z = np.zeros(())
    if s.E is None:  # exact: takes part with its bounds only
        return State(s.shape, s.dtype, s.lo, s.hi, fit(np.int64(PUBLIC), s.shape), z, z)
    lo, hi = wide(s)
    owner = fit(np.where(s.E > 0, MIXED, PUBLIC).astype(np.int64), s.shape)
    return State(s.shape, s.dtype, lo, hi, owner, s.E, s.E)


def _accumulated(c: Ctx, args: Sequence[State | None], mag_out: Array) -> Array:
    """Rounding of a float sum, mean or matrix product: ``gamma`` of its length times
    the sum of the terms' magnitudes, plus the final rounding to the result dtype; and,
    absolutely, the smallest normal for each of its ``2 n + 2`` operations (a product or
    conversion and an addition per term, a mean's division: each result below it is
    flushed to zero, an error no relative bound covers)."""
    out = c.meta.dtype
    op = c.node.op
    if op == "matmul":
        a, b = args[0], args[1]
        assert a is not None and b is not None
        acc, rounds = matmul_accumulation(c.call)
        n = a.shape[-1]
        terms = _contraction(a, b, n)
    else:
        x = args[0]
        assert x is not None
        acc = accumulation(out, c.call.accurate)
        dims = dims_of(c, len(x.shape)) if x.shape else ()
        n = math.prod(x.shape[d] for d in dims)
        rounds = depth(n) if c.call.accurate and out.is_float else n
        with np.errstate(invalid="ignore"):
            terms = reduce_array(_magnitude(*wide(x)), x.shape, dims)
        if not c.call.attrs.get("keepdim") and dims:
            terms = np.squeeze(terms, axis=dims)
        if op == "mean":
            terms = terms / max(n, 1)
    # a product or conversion per term, its additions; a mean divides once more
    e = gamma(rounds + 2, unit(acc)) * terms + (2 * n + 2) * tiny(acc)
    if acc.name != out.name:
        e = e + unit(out) * mag_out
    return _within(acc, terms, rounds + 2, np.asarray(e + tiny(out)))


def _within(acc: DType, terms: Array, rounds: int, e: Array) -> Array:
    """``e``, or infinity (no bound: refused) where the terms' magnitudes, summed and
    rounded ``rounds`` times, may exceed what the accumulation dtype ``acc`` holds: a
    product or partial sum overflows to inf there (a float32 product accumulated in
    float32 did, though the exact result, tracked in float64, was finite)."""
    largest = largest_finite(acc)
    margin = 1 + gamma(rounds, unit(acc))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(np.where(terms * margin < largest, e, math.inf))


def _contraction(a: State, b: State, n: int) -> Array:
    """``|a| @ |b|`` on the magnitude bounds, without broadcasting a compact operand."""
    ma = _magnitude(*wide(a))
    mb = _magnitude(*wide(b))
    ma = np.broadcast_to(ma, a.shape) if ma.ndim != len(a.shape) else ma
    mb = np.broadcast_to(mb, b.shape) if mb.ndim != len(b.shape) else mb
    ka = ma.shape[-1]
    kb = mb.shape[0] if mb.ndim == 1 else mb.shape[-2]
    with np.errstate(all="ignore"):
        if ka == kb == 1:
            return np.asarray(n * np.matmul(ma, mb))
        if ka == 1:
            ma = np.broadcast_to(ma, (*ma.shape[:-1], n))
        if kb == 1:
            mb = np.broadcast_to(mb, (n,) if mb.ndim == 1 else (*mb.shape[:-2], n, mb.shape[-1]))
        return np.asarray(np.matmul(ma, mb))


def _part_magnitude(part: tuple[State, ...]) -> float:
    """The sum of the magnitudes of a clip part's elements, an outer part's from its factors."""
    if len(part) == 1:
        p = part[0]
        return float(reduce_array(_magnitude(*wide(p)), p.shape, tuple(range(len(p.shape)))).sum())
    g, x = part
    per_row = [
        np.broadcast_to(reduce_array(_magnitude(*wide(f)), f.shape, (1,)), (f.shape[0], 1))
        for f in (g, x)
    ]
    return float((per_row[0] * per_row[1]).sum())


def _clip_error(c: Ctx, args: Sequence[State], mag_out: Array) -> Array:
    """Rounding of ``clip_by_subject_norm`` (float64 inside): group sums, norms, scaling,
    the sum over groups, and the cast to the result dtype. Several parts are one vector per
    row: their features add up (a norm's squares summed part by part are still ``feat``
    terms added). An outer part (two factors ``g``, ``x``) counts ``p * q + p + q``
    features (its squared norm is two sums of squares multiplied), and its clipped rows
    two more roundings each (the scale times ``g``, then times ``x``)."""
    layout = part_arguments(c.call)
    parts = [tuple(args[i] for i in at) for at in layout]
    rows = args[0].shape[0]
    feat = max(
        sum(
            math.prod(p[0].shape[1:])
            if len(p) == 1
            else p[0].shape[1] * p[1].shape[1] + p[0].shape[1] + p[1].shape[1]
            for p in parts
        ),
        1,
    )
    products = 2 if any(len(at) == 2 for at in layout) else 1
    bound = float(c.call.attrs["max_norm"])
    u = unit(accumulation(args[0].dtype, True))
    groups = c.args[-1] if len(c.args) > 1 else None
    alone = (  # every row its own group: the kernel sums no rows before clipping
        groups is not None
        and groups.value is not None
        and np.unique(np.asarray(groups.value)).size == rows
    )
    # the group sums' rounding passes through the clip into the sum: an L2 clip is the
    # projection onto a ball (1-Lipschitz); an L1 clip scales radially, 2-Lipschitz in L1,
    # which bounds every element's change
    lipschitz = 2.0 if c.call.attrs.get("ord", 2) == 1 else 1.0
    with np.errstate(all="ignore"):
        # the float64 copy of the rows is exact; an outer part's rows sum to
        # sum_i (sum_j |g_ij|) (sum_k |x_ik|) in magnitude (each product then rounds once)
        magnitude = sum(_part_magnitude(p) for p in parts)
        before = 0.0 if alone else lipschitz * gamma(rows + products, u) * magnitude
        e = before + rows * bound * (gamma(feat + 4, u) + gamma(rows + products, u))
        # results below the smallest normal flush to zero: each square, sum and product
        # errs by it absolutely, and a norm's squares that flush move its scale (by at most
        # 2 feat tiny / bound relatively, on a row of norm about bound)
        e = e + rows * tiny(accumulation(args[0].dtype, True)) * (
            2 * feat * (1 + 1 / bound) + products + 4
        )
    return np.asarray(e + unit(c.meta.dtype) * mag_out + tiny(c.meta.dtype))


def _conv_error(c: Ctx, args: Sequence[State | None], mag_out: Array) -> Array:
    """Rounding of a convolution in its operation dtype: per output, a dot product over
    ``cg * taps`` terms (or ``taps`` dot products over ``cg`` added up, transposed), the
    bias, and the cast to the result dtype: ``gamma(cg * taps + taps + 2)`` times the
    terms' magnitudes ``|w| * |x| + |b|``."""
    x = args[0]
    assert x is not None
    out = c.meta.dtype
    geo = conv_geometry(c.call)
    taps = math.prod(geo["k"])
    rounds = (geo["cin"] // geo["g"]) * taps + taps + 2
    with np.errstate(invalid="ignore"):
        terms = magnitude_terms(c, _magnitude(*wide(x)), x)
        e = gamma(rounds, unit(opmath(out))) * terms + rounds * tiny(opmath(out))
    if opmath(out).name != out.name:
        e = e + unit(out) * mag_out
    return _within(opmath(out), terms, rounds, np.asarray(e + tiny(out)))


def _picked(op: str, i: int) -> bool:
    """Whether argument ``i`` of the choice ``op`` is one whose values the result takes (not
    ``where``'s condition, nor an index of ``gather``, ``index_select`` or ``index``)."""
    if op == "where":
        return i != 0
    return i == 0 or op not in ("gather", "index_select", "index")


def _own(c: Ctx, args: Sequence[State | None], lo: Array, hi: Array) -> Array | None:
    """Bound on how far this prim's computed result is from its exact result on the same
    (computed) arguments, per element; None when it is exact."""
    out = c.meta.dtype
    op = c.node.op
    if not out.is_float:
        return None
    mag = _magnitude(lo, hi)
    if op in EXACT:
        # a choice computed in a wider dtype than the result's: a Python scalar or a wider
        # operand it picks is rounded to the result (float16 maximum(x, 1e-20) is 0); a
        # condition or an index is not picked, so not rounded
        wider = opmath(out).name != out.name and any(
            _picked(op, i) and (r is not None or (a is not None and a.dtype.name != out.name))
            for i, (r, a) in enumerate(zip(c.raw, args, strict=False))
        )
        return np.asarray(unit(out) * mag + tiny(out)) if wider else None
    if _exact_integers(c, args, mag):
        return None
    u, least = _relative(c)
    if op in STEPS:
        step = STEPS[op]
        if step == 0.0:
            return None
        return np.asarray(u * mag + least if math.isnan(step) else np.full(np.shape(mag), step))
    if op == "convert_element_type":
        src = args[0]
        assert src is not None
        if src.dtype.name == out.name or (src.dtype.name, out.name) in _WIDENING:
            return None
        e = u * mag + least
        if not src.dtype.is_float:  # integers convert exactly up to 2**p
            e = np.where(mag <= _EXACT_INT[out.name], 0.0, e)
        return np.asarray(e)
    if op in ONCE or op in LIBM:
        return np.asarray(u * mag + least)
    if op in ACCUMULATE:
        return _accumulated(c, args, mag)
    if op in RESETS:
        parts = [a for a in args[:-1] if a is not None]
        return _clip_error(c, parts, mag)
    if op == "convolution":
        return _conv_error(c, args, mag)
    raise AssertionError(f"prim {op!r} has a privacy rule but no rounding class")


def _relative(c: Ctx) -> tuple[float, float]:
    """``(k, t)`` with ``|computed - exact| <= k |exact| + t`` for a prim rounded once or
    within ``LIBM_ULPS`` (in the operation dtype, then rounded to the result dtype; ``t``
    for results in the subnormal range, where an ulp is absolute); ``k`` is nan for a
    prim whose error is not relative to its own result (sums, clipping)."""
    out = c.meta.dtype
    op = c.node.op
    # flushed to zero below the smallest normal: in the operation dtype, then in the result's
    least = tiny(out) + (tiny(opmath(out)) if opmath(out).name != out.name else 0.0)
    if op == "convert_element_type":
        return unit(out), least
    a, b = unit(opmath(out)), unit(out)
    if op in ONCE or op in STEPS:
        return a + b + a * b, least
    if op in LIBM:
        return LIBM_ULPS * 2 * (a + b + a * b), LIBM_ULPS * least
    return math.nan, least


def integral(s: State | None) -> bool:
    """Whether every computed value of ``s`` is an integer."""
    return s is None or not s.dtype.is_float or (s.integral and s.E is None)


def _exact_integers(c: Ctx, args: Sequence[State | None], mag: Array) -> bool:
    """Integer arguments, and every partial result an integer the dtypes hold exactly."""
    op = c.node.op
    if op not in ("add", "sub", "mul", "sum", "matmul", "convert_element_type"):
        return False
    if not all(integral(a) for a in args):
        return False
    limit = min(_EXACT_INT[c.meta.dtype.name], _EXACT_INT[opmath(c.meta.dtype).name])
    with np.errstate(invalid="ignore"):
        if op == "matmul":
            a, b = args[0], args[1]
            assert a is not None and b is not None
            terms = _contraction(a, b, a.shape[-1])
            limit = min(limit, _EXACT_INT[matmul_accumulation(c.call)[0].name])
        elif op == "sum":
            x = args[0]
            assert x is not None
            dims = dims_of(c, len(x.shape)) if x.shape else ()
            terms = reduce_array(_magnitude(*wide(x)), x.shape, dims)
            limit = min(limit, _EXACT_INT[accumulation(c.meta.dtype, c.call.accurate).name])
        else:
            terms = mag
        return bool(np.all(terms <= limit)) and bool(np.all(mag <= limit))


def _integral_result(c: Ctx, args: Sequence[State | None], own: Array | None) -> bool:
    op = c.node.op
    if op in ("ceil", "floor", "round", "trunc", "sign", "floor_divide", "trunc_divide"):
        return True
    if op in EXACT - {"rand"} or (own is None and op in ACCUMULATE | {"add", "sub", "mul"}):
        return all(integral(a) for a in args)
    return op == "convert_element_type" and own is None and integral(args[0])


def _nonneg(c: Ctx, args: Sequence[State | None], base_lo: Array) -> Array | bool:
    """Where the computed result cannot be negative (rounding keeps the sign of a result)."""
    op = c.node.op
    if op in ONCE or op == "convert_element_type":
        return np.asarray(base_lo >= 0)
    if op in _NONNEG:
        return True
    if op in ACCUMULATE:  # a sum of non-negative computed terms is non-negative
        present = [a for a in args if a is not None]
        return all(bool(np.all(wide(a)[0] >= 0)) for a in present)
    return False


def _narrowed(c: Ctx) -> Ctx:
    """``c`` with each argument of a binary elementwise prim (and each side of a ``where``)
    as its kernel computes with it: cast to the compute dtype. A Python scalar is cast
    (``1e300`` is infinite in float32, and ``0 * inf`` is NaN there). A tensor's cast may
    round it (a 0-d float64 operand of a float32 tensor is cast to float32: ``1e-20 - x``
    was 0 for the x nearest 1e-20, and tracked as at least 3e-28), overflow it, or wrap an
    integer: a known value is cast, an unknown one carries the cast's error."""
    if c.node.op == "where":  # both sides are cast to the result's compute dtype alike
        cd = opmath(c.meta.dtype)
    else:
        family = BINARY_PRIMS.get(c.node.op)
        if family is None or family == "logical":
            return c
        promoted = c.meta.dtype if family == "float" else result_type(operands_of(c.call))
        cd = opmath(promoted)
    args = list(c.args)
    for i, a in enumerate(args):
        if c.raw[i] is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                args[i] = public_state(np.asarray(c.raw[i]).astype(cd.np), cd)
            continue
        if a is None or c.refs[i] is None or a.dtype.name == cd.name or a.dtype.is_bool:
            continue
        if (a.dtype.name, cd.name) in _WIDENING:
            continue
        if a.value is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                args[i] = public_state(np.asarray(a.value).astype(cd.np), cd)
            continue
        lo, hi = wide(a)
        with np.errstate(invalid="ignore", over="ignore"):
            mag = _magnitude(lo, hi)
            if cd.is_float:
                e = unit(cd) * mag + tiny(cd)
                if not a.dtype.is_float:  # integers convert exactly up to 2**p
                    e = np.where(mag <= _EXACT_INT[cd.name], 0.0, e)
                largest = largest_finite(cd) / (1 + unit(cd))
            else:  # an integer narrowed: exact in range, wrapped beyond it
                e = np.zeros(np.shape(mag))
                info: Any = np.iinfo(cd.np)
                largest = float(min(-float(info.min), float(info.max)))
            e = np.where(mag < largest, e, np.inf)
        if np.any(e > 0):
            total = np.asarray(e if a.E is None else a.E + e)
            with np.errstate(invalid="ignore"):
                clo, chi = fit(lo - e, a.shape), fit(hi + e, a.shape)
            args[i] = replace(a, dtype=cd, E=total, clo=clo, chi=chi)
        else:
            args[i] = replace(a, dtype=cd)
    return replace(c, args=args)


def apply(c: Ctx, rule: Rule) -> State:
    """The state of prim application ``c`` under ``rule``, with its rounding error."""
    c = _narrowed(c)
    op = c.node.op
    inexact = any(a is not None and a.E is not None for a in c.args)
    if inexact and (op in STEPS or op in RESETS or not c.meta.dtype.is_float):
        c = replace(c, args=[fold(a) for a in c.args])
        inexact = False
    s = rule(c)
    if not c.meta.dtype.is_float:
        return s
    if s.integral:  # a rule's copy of an argument's flag is not this result's
        s = replace(s, integral=False)
    if inexact:
        m = rule(replace(c, args=[_perturbation(a) for a in c.args]))
        carried = np.where(m.owner == PUBLIC, 0.0, m.G)
        base_lo, base_hi = m.lo, m.hi
        args = [_perturbation(a) for a in c.args]
    else:
        carried = np.zeros(())
        base_lo, base_hi = s.lo, s.hi
        args = list(c.args)
    own = _own(c, args, base_lo, base_hi)
    e = carried if own is None else carried + own
    e = np.where(np.isnan(e), np.inf, e)  # an unknown error (inf - inf) is no error bound
    if not np.any(e > 0):
        return replace(s, integral=_integral_result(c, c.args, own))
    if op in STEPS:  # computed arguments already: the result's own error is folded now
        return replace(_fold_own(s, e), integral=True)
    # the computed values: the exact results of the computed arguments, each moved by at
    # most the prim's own rounding; an error relative to the result widens each end by
    # its own magnitude (``1 + exp(-z)`` stays >= 1 - u however large it can be)
    if own is None:
        zlo = zhi = np.zeros(())
    elif math.isnan((rel := _relative(c))[0]):
        zlo = zhi = own
    else:
        k, t = rel
        zlo, zhi = k * np.abs(base_lo) + t, k * np.abs(base_hi) + t
    with np.errstate(invalid="ignore"):
        clo = np.maximum(base_lo - zlo, s.lo - e)
        chi = np.minimum(base_hi + zhi, s.hi + e)
        nonneg = _nonneg(c, args, base_lo)
        clo = np.where(nonneg, np.maximum(clo, 0.0), clo)
        chi = np.where(np.asarray(base_hi <= 0) & (op in ONCE), np.minimum(chi, 0.0), chi)
    return _fold_owned(
        replace(
            s,
            E=fit(e, s.shape),
            clo=fit(clo, s.shape),
            chi=fit(chi, s.shape),
            table=None,
            vid=_computed_ids(s),
        )
    )


def _fold_owned(s: State) -> State:
    """Elements that only their owner moves (``G == 0``) are computed from the same bits
    on both datasets unless the owner changes, so their rounding cancels between
    neighbours except the owner's own: it is folded into ``L`` (and the bounds), where a
    sum over many owners counts each subject's error once, not every row's."""
    assert s.E is not None and s.clo is not None and s.chi is not None
    with np.errstate(invalid="ignore"):
        owned = _owners(s)[0] & (s.G == 0) & (s.E > 0)
    if not np.any(owned):
        return s
    wlo, whi = wide(s)
    with np.errstate(all="ignore"):
        E = np.where(owned, 0.0, s.E)
        lo = np.where(owned, wlo, s.lo)
        hi = np.where(owned, whi, s.hi)
        L = np.where(owned, np.minimum(s.L + 2 * s.E, whi - wlo), s.L)
    rest = bool(np.any(E > 0))
    return replace(
        s,
        lo=fit(lo, s.shape),
        hi=fit(hi, s.shape),
        L=fit(L, s.shape),
        t1=None,
        t2=None,
        tag=None,
        E=fit(E, s.shape) if rest else None,
        clo=s.clo if rest else None,
        chi=s.chi if rest else None,
    )


def _fold_own(s: State, e: Array) -> State:
    folded = fold(replace(s, E=fit(e, s.shape), clo=s.lo - e, chi=s.hi + e))
    assert folded is not None
    return folded
