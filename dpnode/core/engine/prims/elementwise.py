"""Elementwise prims: unary math, binary math, comparisons, logic, where, clamp, cast.

Dtype rules are a handful of families (``same``, ``float``, ``bool``,
``bitwise``), each a pure function of the operands' promotion result, so that
a prim's torch behaviour is one row in a table. float16/bfloat16 operands are
computed in float32 and rounded once at the end, as torch's opmath does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special  # type: ignore[import-untyped,unused-ignore]

from dpnode.core.engine import division, error_function, flat_math
from dpnode.core.engine.constant_time import select
from dpnode.core.engine.dtypes import BOOL, DEFAULT_FLOAT, DType, dtype, opmath
from dpnode.core.engine.prims.registry import (
    Array,
    AttrSpec,
    Call,
    Privacy,
    Scalar,
    TensorMeta,
    broadcast,
    prim,
)
from dpnode.core.engine.promotion import Kind, Operand, result_type, scalar_dtype

__all__ = ["BINARY_PRIMS", "UNARY_PRIMS", "operands_of"]

UfuncLike = Callable[..., Any]


def operands_of(c: Call, indices: range | list[int] | None = None) -> list[Operand]:
    """Promotion operands of the call's tensor and scalar arguments."""
    out: list[Operand] = []
    idx = range(len(c.args)) if indices is None else indices
    for i in idx:
        a = c.args[i]
        if isinstance(a, TensorMeta):
            out.append(Operand(a.dtype, Kind.ZERODIM if a.ndim == 0 else Kind.TENSOR))
        elif isinstance(a, Scalar):
            out.append(Operand(scalar_dtype(a.value), Kind.SCALAR))
    return out


def as_np(x: Any, d: DType) -> Array:
    """An array argument cast to ``d``, or a Python scalar as a 0-d array of ``d``.

    Integer scalars wrap into narrow integer dtypes, as torch does (uint8 + 300).
    """
    if isinstance(x, np.ndarray):
        return x if x.dtype == d.np else x.astype(d.np)
    if d.is_int and not isinstance(x, bool):
        return np.asarray(x, dtype=np.int64).astype(d.np)
    return np.asarray(x, dtype=d.np)


def _shape(c: Call) -> tuple[int, ...]:
    return broadcast(c, [a.shape for a in c.args if isinstance(a, TensorMeta)])


def _refuse(c: Call, d: DType, refused: frozenset[str], what: str) -> None:
    if d.category.name.lower() in refused or d.name in refused:
        raise c.fail(f"{what} is not supported for dtype {d.name} (torch refuses it too)")


# -- unary -------------------------------------------------------------------

UNARY_PRIMS: dict[str, str] = {}  # name -> dtype family, for docs and tests


def _unary(
    name: str,
    fn: UfuncLike,
    family: str,
    refused: frozenset[str] = frozenset(),
    int_identity: bool = False,
    *,
    privacy: Privacy,
) -> None:
    """Register a unary prim.

    families: ``same`` keeps the dtype; ``float`` maps bool/int to float32;
    ``bool`` returns bool; ``bitwise`` needs bool/int.
    """
    UNARY_PRIMS[name] = family

    def infer(c: Call) -> TensorMeta:
        x = c.tensor(0)
        _refuse(c, x.dtype, refused, name)
        if family == "bitwise" and x.dtype.is_float:
            raise c.fail(f"{name} needs an integer or bool tensor, got {x.dtype.name}", 0)
        out = x.dtype
        if family == "float" and not x.dtype.is_float:
            out = DEFAULT_FLOAT
        elif family == "bool":
            out = BOOL
        return TensorMeta(x.shape, out)

    identity = int_identity  # ints are already integral: floor/ceil/round/trunc

    def kernel(c: Call, args: list[Any], out: Array | None) -> Array:
        (x,) = args
        res = c.out().dtype
        if identity and not res.is_float:
            return np.array(x, copy=True) if out is None else _copy_into(out, x)
        if family == "bool":
            # ml_dtypes' bfloat16 lacks some predicates; float32 holds it exactly
            src = x.astype(np.float32) if x.dtype.kind == "V" else x
            r: Array = fn(src)
            return r
        cd = opmath(res)
        xv = as_np(x, cd)
        if out is not None and cd == res:
            fn(xv, out=out)
            return out
        return np.asarray(fn(xv)).astype(res.np, copy=False)

    prim(
        name,
        privacy=privacy,
        args=1,
        infer=infer,
        inplace=family in ("same", "float", "bitwise"),
        doc=f"elementwise {name} ({family} dtype rule)",
    )(kernel)


def _copy_into(out: Array, x: Array) -> Array:
    np.copyto(out, x)
    return out


def _rsqrt(x: Array, out: Array | None = None) -> Array:
    r = np.asarray(np.sqrt(x, out=out))
    return np.asarray(np.reciprocal(r, out=r))


def _sign(x: Array, out: Array | None = None) -> Array:
    if x.dtype == np.bool_:
        return np.copy(x) if out is None else _copy_into(out, x)
    if x.dtype.kind == "u":
        return (
            np.not_equal(x, 0, out=out).astype(x.dtype, copy=False)
            if out is None
            else np.minimum(x, 1, out=out)
        )
    return np.sign(x, out=out)


def _reciprocal(x: Array, out: Array | None = None) -> Array:
    return np.divide(1, x, out=out)


_F = frozenset({"bool"})
_FLOAT_FUNCTIONS: dict[str, UfuncLike] = {
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "sqrt": np.sqrt,
    "rsqrt": _rsqrt,
    "reciprocal": _reciprocal,
    "sin": flat_math.sin,
    "cos": flat_math.cos,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "erf": error_function.erf,
    "erfc": error_function.erfc,
}
for _name, _fn in _FLOAT_FUNCTIONS.items():
    _unary(_name, _fn, "float", privacy="rule")
_unary("tan", np.tan, "float", privacy="public_only")
# SciPy's erfinv takes 3 to 7 times as long across (0, 1) by its argument (900 at 1), with no
# flat range to keep a private argument in: public values only
_unary("erfinv", scipy.special.erfinv, "float", privacy="public_only")

_unary("neg", np.negative, "same", refused=_F, privacy="rule")
_unary("abs", np.abs, "same", refused=_F, privacy="rule")
_unary("sign", _sign, "same", privacy="rule")
for _name, _fn in {"floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc}.items():
    _unary(_name, _fn, "same", refused=_F, int_identity=True, privacy="rule")
_unary("bitwise_not", np.invert, "bitwise", privacy="rule")
_unary("isnan", np.isnan, "bool", privacy="rule")
_unary("isinf", np.isinf, "bool", privacy="rule")
_unary("isfinite", np.isfinite, "bool", privacy="rule")
_unary("signbit", np.signbit, "bool", privacy="rule")
_unary("logical_not", np.logical_not, "bool", privacy="rule")


# -- binary ------------------------------------------------------------------

BINARY_PRIMS: dict[str, str] = {}


def _int_zero_check(c: Call, b: Any, cd: DType) -> None:
    # A total kernel lets NumPy answer: an integer quotient or remainder by zero is 0.
    if cd.is_float or c.total:
        return
    if isinstance(b, np.ndarray):
        if b.size and not np.all(b):
            raise c.eval_error("integer division by zero (ZeroDivisionError)", 1)
    elif b == 0:
        raise c.eval_error("integer division by zero (ZeroDivisionError)", 1)


def _trunc_div(a: Array, b: Array, out: Array | None = None) -> Array:
    if a.dtype.kind == "f":
        r = np.asarray(np.divide(a, b, out=out))
        return np.asarray(np.trunc(r, out=r))
    # floor and trunc differ where the division is inexact and signs differ; computed
    # first because ``out`` may be the buffer of a or b
    fix = (division.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    q = np.asarray(division.floor_divide(a, b, out=out))
    np.add(q, fix.astype(q.dtype), out=q)
    return q


def _pow_int(c: Call, a: Array, b: Array) -> Array:
    """torch: base**negative is 1 for base 1, +-1 for base -1, else 0. The same work
    whether or not an exponent is negative (a branch on it would show in the time)."""
    neg = b < 0
    r = np.power(a, select(neg, 0, b))
    odd = (b % 2) != 0
    special = select(a == 1, 1, select(a == -1, select(odd, -1, 1), 0))
    return select(neg, special, r).astype(a.dtype, copy=False)


#: Exponents that torch's CPU kernel computes with arithmetic rather than ``std::pow`` in
#: float32 and float64 (``pow_tensor_scalar_optimized_kernel``), as the engine does too: the
#: same bits as torch, and time that does not depend on the base. The library's ``pow``
#: takes 25 to 50 times as long for a base of 0, a negative base, or a result near overflow
#: or underflow; the privacy tracker keeps private bases of the other exponents, and of
#: every exponent in float16 and bfloat16 (the library's ``pow`` there, as torch's), away
#: from those.
FLAT_EXPONENTS: dict[float, Callable[[Array], Array]] = {
    2.0: lambda x: x * x,
    3.0: lambda x: x * x * x,
    0.5: np.sqrt,
    -0.5: lambda x: 1 / np.sqrt(x),
    -1.0: lambda x: 1 / x,
    -2.0: lambda x: 1 / (x * x),
}


def _by_squaring(n: int) -> Callable[[Array], Array]:
    """``x ** n`` by repeated squaring, a sequence of products fixed by ``n``: within
    ``(|n| - 1)`` roundings, inside the tracker's ``LIBM_ULPS`` for ``|n| <= 16``."""

    def power(x: Array) -> Array:
        result, square, k = None, x, abs(n)
        while k:
            if k & 1:
                result = square if result is None else result * square
            k >>= 1
            if k:
                square = square * square
        assert result is not None
        return result if n > 0 else 1 / result

    return power


#: Other integer exponents up to 16 (kurtosis's fourth power of centred values, say): the
#: same products in float16 and bfloat16 too would not be torch's rounding, so those keep
#: the library's; here within a few units in the last place of torch's ``std::pow``.
for _n in (*range(4, 17), *range(-16, -2)):
    FLAT_EXPONENTS[float(_n)] = _by_squaring(_n)


def _binary(
    name: str,
    fn: UfuncLike,
    family: str,
    refused: frozenset[str] = frozenset(),
    zero_check: bool = False,
    *,
    privacy: Privacy,
) -> None:
    """Register a binary prim.

    families: ``same`` (promoted dtype), ``float`` (promoted, int/bool to
    float32), ``compare`` (bool out, compare in the promoted dtype), ``logical``
    (bool out), ``bitwise`` (promoted, must be int/bool).
    """
    BINARY_PRIMS[name] = family

    def infer(c: Call) -> TensorMeta:
        if not any(isinstance(a, TensorMeta) for a in c.args):
            raise c.fail("needs at least one tensor argument")
        for i in (0, 1):
            if c.args[i] is None:
                raise c.fail("missing argument", i)
        ops = operands_of(c)
        d = result_type(ops)
        # torch picks the kernel by the promoted dtype, so refusals follow it
        if not (name == "pow" and isinstance(c.args[1], Scalar)):
            _refuse(c, d, refused, name)
        if name == "hypot" and not d.is_float:
            raise c.fail(f"hypot is not implemented for {d.name} (torch refuses it too)")
        if name == "sub" and any(o.dtype.is_bool for o in ops):
            raise c.fail("subtraction with a bool tensor is not supported (torch refuses it)")
        if family == "bitwise" and d.is_float:
            raise c.fail(f"{name} needs integer or bool operands, got {d.name}")
        if name == "pow" and d.is_int:
            e = c.args[1]
            if isinstance(e, Scalar) and not isinstance(e.value, bool) and e.value < 0:
                raise c.fail("integers to negative integer powers are not allowed", 1)
        out = d
        if family == "float" and not d.is_float:
            out = DEFAULT_FLOAT
        elif family in ("compare", "logical"):
            out = BOOL
        return TensorMeta(_shape(c), out)

    def compute_dtype(c: Call) -> DType:
        res = c.out().dtype
        if family == "float":
            return opmath(res)
        if family == "logical":
            return BOOL
        d = result_type(operands_of(c))
        return opmath(d)

    def kernel(c: Call, args: list[Any], out: Array | None) -> Array:
        cd = compute_dtype(c)
        a, b = (as_np(x, cd) for x in args)
        res = c.out().dtype
        if zero_check:
            _int_zero_check(c, b, cd)
        if name == "pow" and cd.is_int:
            return np.asarray(_pow_int(c, a, b)).astype(res.np, copy=False)
        if name == "pow" and not res.is_low_precision and b.ndim == 0:
            flat = FLAT_EXPONENTS.get(float(b))
            if flat is not None:
                with np.errstate(all="ignore"):
                    return np.asarray(flat(a)).astype(res.np, copy=False)
        if name == "trunc_divide" and res.is_low_precision:
            # torch rounds the quotient to the low precision before truncating
            q = np.asarray(np.divide(a, b)).astype(res.np)
            return np.trunc(q.astype(np.float32)).astype(res.np)
        if out is not None and cd == res:
            fn(a, b, out=out)
            return out
        return np.asarray(fn(a, b)).astype(res.np, copy=False)

    prim(
        name,
        privacy=privacy,
        args=2,
        infer=infer,
        inplace=family not in ("compare", "logical"),
        scalar_args="all",
        doc=f"elementwise {name} ({family} dtype rule)",
    )(kernel)


_binary("add", np.add, "same", privacy="rule")
_binary("sub", np.subtract, "same", privacy="rule")
_binary("mul", np.multiply, "same", privacy="rule")
_binary("div", np.true_divide, "float", privacy="rule")
_binary("floor_divide", division.floor_divide, "same", refused=_F, zero_check=True, privacy="rule")
_binary("trunc_divide", _trunc_div, "same", refused=_F, zero_check=True, privacy="rule")
# NumPy's remainder takes the divisor's sign, like torch's (Python's %)
_binary("remainder", division.remainder, "same", refused=_F, zero_check=True, privacy="rule")
_binary("fmod", division.fmod, "same", refused=_F, zero_check=True, privacy="rule")
_binary("pow", np.power, "same", refused=_F, privacy="rule")
_binary("maximum", np.maximum, "same", privacy="rule")
_binary("minimum", np.minimum, "same", privacy="rule")
_binary("atan2", np.arctan2, "float", privacy="public_only")
_binary("hypot", flat_math.hypot, "same", privacy="rule")
_binary("copysign", np.copysign, "float", privacy="public_only")
for _name, _fn in {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}.items():
    _binary(_name, _fn, "compare", privacy="rule")
for _name, _fn in {
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}.items():
    _binary(_name, _fn, "logical", privacy="rule")
for _name, _fn in {
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
}.items():
    _binary(_name, _fn, "bitwise", privacy="rule")
_binary("bitwise_left_shift", np.left_shift, "bitwise", refused=_F, privacy="public_only")
_binary("bitwise_right_shift", np.right_shift, "bitwise", refused=_F, privacy="public_only")


# -- where, clamp, convert ---------------------------------------------------


def _where_infer(c: Call) -> TensorMeta:
    cond = c.tensor(0)
    if not cond.dtype.is_bool:
        raise c.fail(f"condition must be bool, got {cond.dtype.name}", 0)
    for i in (1, 2):
        if c.args[i] is None:
            raise c.fail("missing argument", i)
    d = result_type(operands_of(c, [1, 2]))
    return TensorMeta(_shape(c), d)


@prim("where", privacy="rule", args=3, infer=_where_infer, scalar_args=frozenset({1, 2}))
def _where(c: Call, args: list[Any], out: Array | None) -> Array:
    """where(cond, a, b): a where cond else b; a and b promote like torch.where. In time
    that does not depend on ``cond`` (:mod:`dpnode.core.engine.constant_time`)."""
    cond, a, b = args
    d = c.out().dtype
    return select(cond, as_np(a, d), as_np(b, d), d.np)


def _clamp_infer(c: Call) -> TensorMeta:
    c.tensor(0)
    if c.args[1] is None and c.args[2] is None:
        raise c.fail("at least one of min and max must be given")
    for i in (1, 2):
        a = c.args[i]
        if isinstance(a, Scalar) and isinstance(a.value, float) and math.isnan(a.value):
            raise c.fail("a NaN bound makes every result NaN; refused", i)
    d = result_type(operands_of(c))
    if d.is_bool and any(isinstance(a, Scalar) for a in c.args[1:]):
        # torch's scalar-bound clamp kernel has no bool version (tensor bounds do)
        raise c.fail("clamp with a scalar bound is not implemented for bool (torch refuses it)")
    return TensorMeta(_shape(c), d)


@prim(
    "clamp",
    privacy="rule",
    args=3,
    infer=_clamp_infer,
    inplace=True,
    scalar_args=frozenset({1, 2}),
    optional_args=frozenset({1, 2}),
)
def _clamp(c: Call, args: list[Any], out: Array | None) -> Array:
    """clamp(x, min, max): min/max are tensors, scalars or null; NaN in x propagates."""
    x, lo, hi = args
    res = c.out().dtype
    cd = opmath(res)
    r = as_np(x, cd)
    if out is not None and out is x and cd == res:
        r = out  # x dies here: clamp it in place
    elif r is x:
        # never write into a bound's buffer before reading it: copy x instead
        r = r.copy()
    if lo is not None:
        r = np.maximum(r, as_np(lo, cd), out=r if r.shape == c.out().shape else None)
    if hi is not None:
        r = np.minimum(r, as_np(hi, cd), out=r if r.shape == c.out().shape else None)
    return np.asarray(r).astype(res.np, copy=False)


def _convert_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    return TensorMeta(x.shape, dtype(c.attr("dtype")))


@prim(
    "convert_element_type",
    privacy="rule",
    args=1,
    attrs={"dtype": AttrSpec("dtype")},
    infer=_convert_infer,
)
def _convert(c: Call, args: list[Any], out: Array | None) -> Array:
    """Cast to ``dtype`` (float to int truncates toward zero, like torch's C cast)."""
    (x,) = args
    d = c.out().dtype
    if x.dtype.name == "bfloat16" and not d.is_float:
        x = x.astype(np.float32)
    if d.name == "bfloat16" and x.dtype.kind in "iub":
        return np.asarray(x.astype(np.float32).astype(d.np))
    return np.asarray(x.astype(d.np))
