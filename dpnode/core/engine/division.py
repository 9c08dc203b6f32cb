"""Rounding divisions and remainders in time that does not depend on the values.

NumPy's float ``fmod`` loops over the quotient's bits (45 times as long at a quotient of
2^53 as below 1 on the dev box), and its ``remainder`` and ``floor_divide`` branch on each
element's signs and on whether its quotient is 0; integer ``remainder``, and integer
division by a tensor, branch on the signs (3 times as long on mixed signs as on one sign).
The time of ``sum(x % 1)`` then counts private values.

These kernels give NumPy's results bit for bit, signed zeros included, with arithmetic that
takes the same time whatever the values:

* **floats**: when every quotient ``|x / v|`` is below :data:`MAX_QUOTIENT` (2^26, 2^21 in
  float32) and every divisor
  lies in ``[2^-900, 2^900]``, the remainder is ``|x| - q |v|`` for ``q = trunc(|x| / |v|)``,
  computed exactly by splitting ``|v|`` into two halves of 26 bits (Veltkamp), so that each
  product with ``q`` is exact, and corrected by one ``|v|`` where ``q`` came out one too
  large. NumPy's sign rules follow as arithmetic and :func:`select`. float32 operands are
  computed in float64 (exactly, then rounded once). The privacy tracker refuses a private
  dividend whose bounds allow a larger quotient, so the check that picks this path holds for
  every private evaluation; other values (public ones) take NumPy's kernels.
* **integers**: the floor quotient by a scalar is NumPy's (a multiplication by a reciprocal
  that does not branch); by a tensor, the magnitudes' quotient with the signs put back.
  Remainders are ``x - q v``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpnode.core.engine.constant_time import by_blocks, into, select

__all__ = ["MAX_QUOTIENT", "fits", "floor_divide", "fmod", "remainder"]

Array = np.ndarray[Any, Any]

#: The largest quotient ``|x / v|`` of a float division computed in constant time, by the
#: compute dtype's item size: ``q`` times a 26-bit half of the divisor must be exact in
#: float64's 53 bits, and float32's own quotient must round to the nearest integer (its
#: error stays below one half up to 2^22).
MAX_QUOTIENT = {8: 2.0**26, 4: 2.0**21}
#: Divisors whose halves, and their products with a quotient, are normal floats.
DIVISOR_RANGE = (2.0**-900, 2.0**900)
_SPLIT = 2.0**27 + 1.0


def fits(a: Array, b: Array) -> bool:
    """Whether float operands take the constant-time path: divisors in :data:`DIVISOR_RANGE`
    and quotients below :data:`MAX_QUOTIENT` (a whole-array check, taken on every element)."""
    lo, hi = DIVISOR_RANGE
    with np.errstate(all="ignore"):
        m = np.abs(b.astype(np.float64))
        if not np.all((m >= lo) & (m <= hi)):
            return False
        cap = MAX_QUOTIENT[np.result_type(a, b).itemsize]
        return bool(np.all(np.abs(a.astype(np.float64)) < cap * m))


def _fmod64(a: Array, b: Array) -> Array:
    """``np.fmod(a, b)`` for float64 operands that :func:`fits`."""
    x, v = np.abs(a), np.abs(b)
    q = np.trunc(x / v)
    c = v * _SPLIT
    high = c - (c - v)
    low = v - high
    r = (x - q * high) - q * low  # exact: x - q v, in (-v, v)
    r = r + v * (r < 0)  # q one too large: the quotient rounded up to an integer
    return np.asarray(np.copysign(r, a))


def _parts64(a: Array, b: Array) -> tuple[Array, Array]:
    """NumPy's ``divmod`` for float64 operands that :func:`fits`: (floor quotient, remainder),
    the same operations as its ``npy_divmod`` without its branches."""
    mod = _fmod64(a, b)
    div = (a - mod) / b
    fix = (mod != 0) & ((b < 0) != (mod < 0))
    mod = mod + b * fix
    mod = select(mod == 0, np.copysign(0.0, b), mod)
    div = div - fix
    floor = np.floor(div)
    floor = floor + ((div - floor) > 0.5)
    floor = select(div != 0, floor, np.copysign(0.0, a / b))
    return floor, mod


_FLOAT_KERNELS: dict[str, Callable[[Array, Array], Array]] = {
    "fmod": _fmod64,
    "floor_divide": lambda a, b: _parts64(a, b)[0],
    "remainder": lambda a, b: _parts64(a, b)[1],
}


def _float(kind: str, a: Array, b: Array) -> Array | None:
    if not fits(a, b):
        return None
    out = a.dtype if a.dtype == b.dtype else np.result_type(a, b)
    a64, b64 = np.broadcast_arrays(a, b)
    with np.errstate(all="ignore"):
        return by_blocks(_FLOAT_KERNELS[kind], a64, b64).astype(out, copy=False)


def _int_floor(a: Array, b: Array) -> Array:
    if b.ndim == 0 or b.size == 1:
        return np.floor_divide(a, b)  # by a scalar: a reciprocal's multiplication
    # by a tensor, on magnitudes (one sign, so the quotient's fix never branches)
    d = a.dtype
    u = np.dtype(f"u{d.itemsize}")
    q = (np.abs(a).astype(u) // np.abs(b).astype(u)).astype(d)  # |INT_MIN| is 2^63 unsigned
    negative = (a < 0) != (b < 0)
    q = q - 2 * q * negative  # q * sign, wrapping as NumPy wraps
    inexact = (a - q * b) != 0
    return np.asarray((q - (negative & inexact).astype(d)) * (b != 0))  # by 0: 0, as NumPy


def floor_divide(a: Array, b: Array, out: Array | None = None) -> Array:
    """``np.floor_divide(a, b)``; divisors are nonzero."""
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        r = _float("floor_divide", a, b)
        return into(np.floor_divide(a, b) if r is None else r, out)
    with np.errstate(all="ignore"):
        return into(_int_floor(a, b), out)


def remainder(a: Array, b: Array, out: Array | None = None) -> Array:
    """``np.remainder(a, b)``: the divisor's sign, as torch's and Python's ``%``."""
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        r = _float("remainder", a, b)
        return into(np.remainder(a, b) if r is None else r, out)
    with np.errstate(all="ignore"):
        return into((a - _int_floor(a, b) * b) * (b != 0), out)


def fmod(a: Array, b: Array, out: Array | None = None) -> Array:
    """``np.fmod(a, b)``: the dividend's sign, as C's and torch's ``fmod``."""
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        r = _float("fmod", a, b)
        return into(np.fmod(a, b) if r is None else r, out)
    with np.errstate(all="ignore"):
        m = (a - _int_floor(a, b) * b) * (b != 0)
        return into(m - b * ((m != 0) & ((a < 0) != (b < 0))), out)
