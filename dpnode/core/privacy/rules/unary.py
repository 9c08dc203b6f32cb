"""Rules of the unary elementwise prims: value range and change bound per function.

Each function gets two things over an interval ``[lo, hi]``: its range, and a bound on
``|f(x) - f(x')|`` for ``x, x'`` in the interval with ``|x - x'| <= d``. Monotone
functions that are convex or concave on their domain get the exact *window* bound
(the steepest window of length ``d`` sits at one end); the others a Lipschitz bound
(the largest ``|f'|`` on the interval). Discontinuous functions (floor, sign, the
predicates) move by at most their range width, and not at all when ``d == 0``.
Outside a function's domain the range comes out NaN or infinite, which ``finish``
turns into an unbounded state that can never be published.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import scipy.special

from dpnode.core.engine.dtypes import DType
from dpnode.core.privacy.rounding import wide
from dpnode.core.privacy.rules.base import Ctx, finish, rule
from dpnode.core.privacy.state import PUBLIC, Array, State, mul0
from dpnode.core.privacy.tables import Table

__all__ = [
    "FUNCTIONS",
    "TIMING_FLAT",
    "Fn",
    "check_timing",
    "refuse_outside",
    "tighten",
    "widen",
]

F = Callable[[Array], Array]


@dataclass(frozen=True)
class Fn:
    """Range and change bound of one function over intervals."""

    rng: Callable[[Array, Array], tuple[Array, Array]]
    delta: Callable[[Array, Array, Array], Array]


def _window(f: F, increasing: bool) -> Fn:
    def rng(lo: Array, hi: Array) -> tuple[Array, Array]:
        a, b = f(lo), f(hi)
        return (a, b) if increasing else (b, a)

    def delta(lo: Array, hi: Array, d: Array) -> Array:
        top = np.abs(f(hi) - f(np.maximum(lo, hi - d)))
        bottom = np.abs(f(np.minimum(hi, lo + d)) - f(lo))
        return np.where(d > 0, np.maximum(top, bottom), 0.0)

    return Fn(rng, delta)


def _closest0(lo: Array, hi: Array) -> Array:
    return np.asarray(np.clip(0.0, lo, hi))


def _farthest0(lo: Array, hi: Array) -> Array:
    return np.maximum(np.abs(lo), np.abs(hi))


def _lipschitz(f: F, increasing: bool, deriv: F, at: Callable[[Array, Array], Array]) -> Fn:
    """A monotone function whose largest |f'| on [lo, hi] is at ``at(lo, hi)``."""

    def rng(lo: Array, hi: Array) -> tuple[Array, Array]:
        a, b = f(lo), f(hi)
        return (a, b) if increasing else (b, a)

    def delta(lo: Array, hi: Array, d: Array) -> Array:
        return mul0(np.abs(deriv(at(lo, hi))), d)

    return Fn(rng, delta)


def _reciprocal_rng(lo: Array, hi: Array) -> tuple[Array, Array]:
    ok = (lo > 0) | (hi < 0)
    return np.where(ok, 1 / hi, -np.inf), np.where(ok, 1 / lo, np.inf)


def _reciprocal_delta(lo: Array, hi: Array, d: Array) -> Array:
    ok = (lo > 0) | (hi < 0)
    w = _window(np.reciprocal, False).delta(lo, hi, d)
    return np.where(ok, w, np.where(d > 0, np.inf, 0.0))


def _even(f: F, deriv: F) -> Fn:
    """An even function increasing in |x| (cosh): range from |x|, slope at the largest |x|."""

    def rng(lo: Array, hi: Array) -> tuple[Array, Array]:
        return f(_closest0(lo, hi)), f(_farthest0(lo, hi))

    def delta(lo: Array, hi: Array, d: Array) -> Array:
        return mul0(np.abs(deriv(_farthest0(lo, hi))), d)

    return Fn(rng, delta)


def _periodic(lo: Array, hi: Array) -> tuple[Array, Array]:
    # sin and cos of an infinite argument are NaN: no range (refused) unless it is finite
    finite = np.isfinite(lo) & np.isfinite(hi)
    return np.where(finite, -1.0, np.nan), np.where(finite, 1.0, np.nan)


_SQRT_PI = float(np.sqrt(np.pi))

FUNCTIONS: dict[str, Fn] = {
    "exp": _window(np.exp, True),
    "exp2": _window(np.exp2, True),
    "expm1": _window(np.expm1, True),
    "log": _window(np.log, True),
    "log2": _window(np.log2, True),
    "log10": _window(np.log10, True),
    "log1p": _window(np.log1p, True),
    "sqrt": _window(np.sqrt, True),
    "acosh": _window(np.arccosh, True),
    "rsqrt": _window(lambda x: 1 / np.sqrt(x), False),
    "reciprocal": Fn(_reciprocal_rng, _reciprocal_delta),
    "tanh": _lipschitz(np.tanh, True, lambda x: 1 - np.tanh(x) ** 2, _closest0),
    "atan": _lipschitz(np.arctan, True, lambda x: 1 / (1 + x * x), _closest0),
    # 1 / sqrt(1 + x^2) from hypot: x * x overflowed above 1.3e154 and made the slope 0
    "asinh": _lipschitz(np.arcsinh, True, lambda x: 1 / np.hypot(1.0, x), _closest0),
    "erf": _lipschitz(scipy.special.erf, True, lambda x: 2 / _SQRT_PI * np.exp(-x * x), _closest0),
    "erfc": _lipschitz(
        scipy.special.erfc, False, lambda x: 2 / _SQRT_PI * np.exp(-x * x), _closest0
    ),
    "sinh": _lipschitz(np.sinh, True, np.cosh, _farthest0),
    "asin": _lipschitz(np.arcsin, True, lambda x: 1 / np.sqrt(1 - x * x), _farthest0),
    "acos": _lipschitz(np.arccos, False, lambda x: 1 / np.sqrt(1 - x * x), _farthest0),
    "atanh": _lipschitz(np.arctanh, True, lambda x: 1 / (1 - x * x), _farthest0),
    "cosh": _even(np.cosh, np.sinh),
    "abs": _even(np.abs, lambda x: np.ones_like(x)),
    "sin": Fn(_periodic, lambda lo, hi, d: mul0(1.0, d)),
    "cos": Fn(_periodic, lambda lo, hi, d: mul0(1.0, d)),
    "neg": Fn(lambda lo, hi: (-hi, -lo), lambda lo, hi, d: d),
}


def _step(f: F) -> Fn:
    """Integer-valued steps (floor...): width-capped ``d + 1``, exact 0 when ``d == 0``."""

    def rng(lo: Array, hi: Array) -> tuple[Array, Array]:
        return f(lo), f(hi)

    return Fn(rng, lambda lo, hi, d: np.where(d > 0, d + 1, 0.0))


_STEPS = {"floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc}
for _n, _f in _STEPS.items():
    FUNCTIONS[_n] = _step(_f)
FUNCTIONS["sign"] = Fn(
    lambda lo, hi: (np.sign(lo), np.sign(hi)), lambda lo, hi, d: np.where(d > 0, np.inf, 0.0)
)

_PREDICATES = ("isnan", "isinf", "isfinite", "signbit")


def _bool_fn() -> Fn:
    return Fn(
        lambda lo, hi: (np.zeros(np.shape(lo)), np.ones(np.shape(lo))),
        lambda lo, hi, d: np.where(d > 0, 1.0, 0.0),
    )


for _n in _PREDICATES:
    FUNCTIONS[_n] = _bool_fn()
# Exact arithmetic knows one zero, IEEE two: x * 0.0 moves by 0 (d == 0) and is still
# -0.0 for a negative x. signbit reads that sign, so wherever the range holds a zero its
# value may differ between neighbours whatever d says.
FUNCTIONS["signbit"] = Fn(
    lambda lo, hi: (np.zeros(np.shape(lo)), np.ones(np.shape(lo))),
    lambda lo, hi, d: np.where((d > 0) | ((lo <= 0) & (hi >= 0)), 1.0, 0.0),
)
FUNCTIONS["logical_not"] = FUNCTIONS["bitwise_not_bool"] = Fn(
    lambda lo, hi: (1 - hi, 1 - lo), lambda lo, hi, d: np.minimum(d, 1.0)
)
FUNCTIONS["bitwise_not_int"] = Fn(lambda lo, hi: (-hi - 1, -lo - 1), lambda lo, hi, d: d)


def widen(lo: Array, hi: Array, dt: DType) -> tuple[Array, Array]:
    """Bounds widened by the rounding a float computation may have added (64 ulps).

    Ranges of discontinuous functions (floor, sign, casts to integers) are taken on the
    widened bounds: a value that rounding pushed just past an integer must be covered.

    >>> from dpnode.core.engine.dtypes import dtype
    >>> bool(widen(np.float64(0.0), np.float64(1.0), dtype("float32"))[0] < 0)
    True
    """
    if not dt.is_float:
        return lo, hi
    npd: Any = dt.np
    eps = float(ml_dtypes.finfo(npd).eps)  # type: ignore[no-untyped-call]  # bfloat16: 2^-7
    with np.errstate(all="ignore"):
        d = 64 * eps * np.maximum(np.abs(lo), np.abs(hi))
    return lo - d, hi + d


_F64 = np.finfo(np.float64)
_F32 = np.finfo(np.float32)
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_ABOVE_ONE = float(np.nextafter(1.0, 2.0))

#: Where each kernel takes the same time whatever its argument, for float64 and for the
#: narrower floats (float32 kernels; float16 and bfloat16 compute through them). Outside,
#: special cases run: results that overflow, underflow or are infinite, a logarithm's zero,
#: the reduction of a large angle, and paths chosen near those edges. sinh(700.0) takes 30
#: times as long as sinh(600.0), a float32 sinh(88) 118 times sinh(85), sin(1e22) 7 times
#: sin(0.1) in the library. Measured with margins (``python -m bench.side_channels
#: --kernels``); a kernel not listed took the same time over its domain within 1.3x (erf and
#: erfc are computed so that they do, ``dpnode.core.engine.error_function``, as are sin, cos
#: and hypot, ``dpnode.core.engine.flat_math``; erfinv takes public values only).
TIMING_FLAT: dict[str, tuple[tuple[float, float] | None, tuple[float, float] | None]] = {
    "exp": ((-700.0, 700.0), None),
    "exp2": ((-1020.0, 1020.0), (-124.0, 124.0)),
    "expm1": ((-float(_F64.max), 700.0), (-float(_F32.max), 80.0)),
    "sinh": ((-640.0, 640.0), (-80.0, 80.0)),
    "cosh": ((-700.0, 700.0), (-80.0, 80.0)),
    "log": ((float(_F64.tiny), float(_F64.max)), None),
    "log2": ((float(_F64.tiny), float(_F64.max)), (float(_F32.tiny), float(_F32.max))),
    "log10": ((float(_F64.tiny), float(_F64.max)), (float(_F32.tiny), float(_F32.max))),
    "log1p": ((-_BELOW_ONE, float(_F64.max)), (-_BELOW_ONE, float(_F32.max))),
    # the engine's own kernels, one time below 2^19 (dpnode.core.engine.flat_math)
    "sin": ((-(2.0**19), 2.0**19), (-(2.0**19), 2.0**19)),
    "cos": ((-(2.0**19), 2.0**19), (-(2.0**19), 2.0**19)),
    "asin": ((-_BELOW_ONE, _BELOW_ONE), (-_BELOW_ONE, _BELOW_ONE)),
    "acos": ((-_BELOW_ONE, _BELOW_ONE), (-_BELOW_ONE, _BELOW_ONE)),
    "atanh": ((-_BELOW_ONE, _BELOW_ONE), (-_BELOW_ONE, _BELOW_ONE)),
    "acosh": (None, (_ABOVE_ONE, float(_F32.max))),
}


def check_timing(c: Ctx, x: State) -> None:
    """Refuse a kernel whose time would show where a private argument lies: one with an
    element whose bounds reach beyond the kernel's flat range (:data:`TIMING_FLAT`) and may
    take more than one value. Decided from the bounds alone, before any value is read."""
    ranges = TIMING_FLAT.get(c.node.op)
    flat = None if ranges is None else ranges[0 if c.meta.dtype.name == "float64" else 1]
    if flat is None or x.is_public:
        return
    lo, hi = flat
    refuse_outside(
        c,
        x,
        lo,
        hi,
        f"its kernel's time depends on where its argument lies outside [{lo:.6g}, "
        f"{hi:.6g}] ({c.meta.dtype.name}), and this private argument's bounds reach "
        "beyond: the time of the answer would show private values. Clamp the argument "
        "into that range first",
    )


def refuse_outside(c: Ctx, x: State, lo: Any, hi: Any, message: str) -> None:
    """Refuse, with ``message``, a private argument with an element whose bounds (of the
    computed values, which the kernel reads) may leave ``[lo, hi]`` (a NaN end: anywhere)
    and take more than one value: one value whatever the data takes one time."""
    xlo, xhi = wide(x)
    with np.errstate(invalid="ignore"):
        inside = ((xlo >= lo) & (xhi <= hi)) | (xlo == xhi)
    if np.any((x.owner != PUBLIC) & ~inside):
        raise c.fail(message)


def _apply(c: Ctx, fn: Fn) -> State:
    x = c.arg(0)
    check_timing(c, x)
    xlo, xhi = x.lo, x.hi
    if c.node.op in (*_STEPS, "sign"):
        xlo, xhi = widen(xlo, xhi, x.dtype)
    with np.errstate(all="ignore"):
        a, b = fn.rng(xlo, xhi)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        L = fn.delta(x.lo, x.hi, np.asarray(x.L))
        G = fn.delta(x.lo, x.hi, np.asarray(x.G))
    table = None
    if x.table is not None:
        from dpnode.core.privacy.rules.elementwise import kernel_on_tables

        table = kernel_on_tables(c, [x.table])
    s = finish(c.meta, lo, hi, x.owner, L, G)
    if table is not None:
        s = tighten(s, table)
    return s


def tighten(s: State, table: Table) -> State:
    """Intersect bounds with the table's values; cap each element's change at their spread."""
    v = table.vals.astype(np.float64)
    vmin, vmax = v.min(axis=-1), v.max(axis=-1)
    with np.errstate(invalid="ignore"):  # inf - inf: a spread the table cannot tell
        spread = vmax - vmin
    return s.with_(
        lo=np.maximum(s.lo, vmin),
        hi=np.minimum(s.hi, vmax),
        L=np.fmin(s.L, spread),  # a NaN spread leaves the tracked change as it was
        table=table,
    )


def _name_of(c: Ctx) -> str:
    op = c.node.op
    if op in ("floor", "ceil", "round", "trunc") and not c.meta.dtype.is_float:
        return "identity"
    if op == "bitwise_not":
        return "bitwise_not_bool" if c.meta.dtype.is_bool else "bitwise_not_int"
    if op == "logical_not" and not c.arg(0).dtype.is_bool:
        return "isnan"  # x == 0 on a number: a predicate
    if op == "sign" and c.meta.dtype.is_bool:
        return "identity"
    return op


FUNCTIONS["identity"] = Fn(lambda lo, hi: (lo, hi), lambda lo, hi, d: d)


@rule(
    *(n for n in FUNCTIONS if n not in ("identity", "bitwise_not_bool", "bitwise_not_int")),
    "bitwise_not",
)
def unary(c: Ctx) -> State:
    """Any unary elementwise prim of :data:`FUNCTIONS`."""
    return _apply(c, FUNCTIONS[_name_of(c)])
