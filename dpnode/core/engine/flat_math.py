"""Library functions recomputed so that their time does not depend on their arguments.

``sin`` and ``cos``: the library's pick a formula by magnitude (a tiny argument, below 0.855,
below 2.43, reduced by multiples of pi/2) and then by the reduced argument's quadrant and
size, each a branch on the value: 1.9 times as long at 500 as at 0, inside the range the
tracker allowed private arguments (``[-512, 512]``). Here every element takes the same steps:
``n = rint(x * 2/pi)``; ``x - n pi/2`` as a double-double, with pi/2 in four parts of which
the first three have 33 bits (each product with ``n`` exact, ``|n| < 2^20``) and error-free
sums (Knuth's TwoSum) carrying what each subtraction rounds off, so the reduced argument is
good to about 2^-150 of pi/2 however close ``x`` lies to a multiple of it; both Taylor
polynomials on it (to ``r^19`` and ``r^20``: the next terms are below 2^-72 of the result on
``|r| <= pi/4``), with the low part's first-order term; the quadrant picks one of them and
its sign by a bit blend. The results are within 2 units in the last place of the exact
values (``tests/engine/test_flat_math.py`` checks them against 300-bit arithmetic, near
multiples of pi/2 included), where the library's are within 1; the tracker allows a library
function ``LIBM_ULPS``. Arguments beyond ``[-2^19, 2^19]`` (public ones only) take NumPy's.

``hypot``: the library's takes a shortcut when one side is negligible, swaps its arguments by
size and rescales huge and tiny ones, each a branch on the values: 2.5 times as long on a
random mix of magnitudes as on one (``python -m bench.side_channels --kernels``). Here both
sides are scaled by the same power of two, taken from the larger's exponent bits, so that
the larger lies in ``[1, 2)``; ``sqrt(a^2 + b^2)`` is then computed without overflow or
underflow and scaled back, all with arithmetic that does not branch. The result is within
2 units in the last place of the exact value (three roundings, the scaling exact), inside
the error the tracker allows a library function (``LIBM_ULPS``); the library's is within 1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpnode.core.engine.constant_time import by_blocks, into, select

__all__ = ["cos", "hypot", "sin"]

Array = np.ndarray[Any, Any]

_EXPONENT = np.uint64(0x7FF)
_MANTISSA_BITS = np.uint64(52)


def _power_of_two(e: Array) -> Array:
    """``2.0 ** e`` for integer ``e`` in [-1022, 1023], built from its bits."""
    return ((e + 1023).astype(np.uint64) << _MANTISSA_BITS).view(np.float64)


def _hypot(x: Array, y: Array) -> Array:
    """``hypot`` of finite magnitudes ``x, y``."""
    m = np.maximum(x, y)
    e = ((m.view(np.uint64) >> _MANTISSA_BITS) & _EXPONENT).astype(np.int64) - 1023
    # 2^-e in two halves, each a normal float (e is -1023 for 0, 1023 at most)
    half = e // 2
    up, down = _power_of_two(-half), _power_of_two(half - e)
    xs, ys = x * up * down, y * up * down  # the larger in [1, 2); 0 stays 0
    return np.asarray(np.sqrt(xs * xs + ys * ys) * _power_of_two(half) * _power_of_two(e - half))


def hypot(a: Array, b: Array, out: Array | None = None) -> Array:
    """``sqrt(a^2 + b^2)`` without undue overflow or underflow (``np.hypot``, within 2 ulps);
    infinite or NaN operands are NumPy's (a check over every element)."""
    dtype = np.result_type(a, b)
    x, y = (np.abs(np.asarray(t, dtype=np.float64)) for t in np.broadcast_arrays(a, b))
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        r = np.hypot(a, b)
    else:
        with np.errstate(all="ignore"):
            r = by_blocks(_hypot, x, y)
    return into(r, out, dtype)


#: pi/2 = _P1 + _P2 + _P3 + _P4 to about 2^-160; the first three have 33 significant bits
_P1 = float.fromhex("0x1.921fb54400000p+0")
_P2 = float.fromhex("0x1.0b4611a600000p-34")
_P3 = float.fromhex("0x1.3198a2e000000p-69")
_P4 = float.fromhex("0x1.b839a252049c1p-104")
_TWO_OVER_PI = float.fromhex("0x1.45f306dc9c883p-1")
#: arguments reduced in constant time: n * _P1 exact for |n| < 2^20
_REDUCED = 2.0**19
#: Taylor coefficients: sin r = r + r^3 S(r^2), cos r = 1 - r^2 / 2 + r^4 C(r^2)
_SIN = [(-1) ** k / math.factorial(2 * k + 1) for k in range(9, 0, -1)]
_COS = [(-1) ** k / math.factorial(2 * k) for k in range(10, 1, -1)]


def _two_sum(a: Array, b: Array) -> tuple[Array, Array]:
    """``s + e == a + b`` exactly, ``s = fl(a + b)`` (Knuth), without a branch."""
    s = a + b
    v = s - a
    return s, (a - (s - v)) + (b - v)


def _horner(z: Array, coefficients: list[float]) -> Array:
    p = z * coefficients[0]
    p += coefficients[1]
    for c in coefficients[2:]:
        p *= z
        p += c
    return p


def _sin_cos(x: Array) -> tuple[Array, Array, Array]:
    """(sin of the reduced argument, its cos, the quadrant) for ``|x| <= _REDUCED``."""
    n = np.rint(x * _TWO_OVER_PI)
    hi = x - n * _P1  # exact: n * _P1 is within a factor 2 of x (Sterbenz), or 0
    hi, lo = _two_sum(hi, -n * _P2)
    hi, e = _two_sum(hi, -n * _P3)
    lo = lo + e - n * _P4
    hi, lo = _two_sum(hi, lo)
    z = hi * hi
    s = hi + (hi * z * _horner(z, _SIN) + lo * (1.0 - 0.5 * z))
    c = 1.0 - (0.5 * z - (z * z * _horner(z, _COS) - lo * hi))
    return s, c, n.astype(np.int64) & 3


def _pick(kind: str, x: Array, s: Array, c: Array, q: Array) -> Array:
    odd = (q & 1) != 0
    if kind == "sin":  # sin, cos, -sin, -cos
        r = select(odd, c, s)
        r = select((q & 2) != 0, -r, r)
        return select(x == 0, x, r)  # the zero's sign
    r = select(odd, s, c)  # cos, -sin, -cos, sin
    return select(((q + 1) & 2) != 0, -r, r)


def _trig(kind: str, x: Array, out: Array | None) -> Array:
    dtype = np.asarray(x).dtype
    x64 = np.asarray(x, dtype=np.float64)
    if not np.all(np.abs(x64) <= _REDUCED):  # NaN, infinities and large public values
        r = np.sin(x) if kind == "sin" else np.cos(x)
    else:
        with np.errstate(all="ignore"):
            r = by_blocks(lambda part: _pick(kind, part, *_sin_cos(part)), x64)
    return into(r, out, dtype)


def sin(x: Array, out: Array | None = None) -> Array:
    """``np.sin(x)``, within 2 ulps, in time that does not depend on ``x``."""
    return _trig("sin", x, out)


def cos(x: Array, out: Array | None = None) -> Array:
    """``np.cos(x)``, within 2 ulps, in time that does not depend on ``x``."""
    return _trig("cos", x, out)
