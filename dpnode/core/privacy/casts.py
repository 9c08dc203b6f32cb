"""Casts between a private scalar and its comparisons: where a threshold cuts the root.

``x.float() <= b`` compares the engine's float32 rounding of a float64 ``x`` with ``b``,
not ``x`` itself. A threshold table (:mod:`dpnode.core.privacy.thresholds`) cuts ``x``'s
real line where each comparison can change and evaluates the kernel on one value per
piece; through a cast the cut is not at ``b`` but where the cast of ``x`` crosses ``b``,
which rounding moves: every float64 within half a float32 step below ``b`` rounds up to
``b``, and ties go to even. Rather than reason about each rounding mode, the cut is
*found* with the engine's own kernels: a numeric cast to a float dtype (int to float,
float to float, as the engine computes it: rounding to nearest, flushing subnormals,
overflowing to infinity) is monotone non-decreasing, and so is the conversion of the
comparison to its dtype, so ``T(r) >= b`` and ``T(r) > b`` (``T`` the whole chain) each
switch once as ``r`` runs through the root's values in order, and a bisection over
those values (their bit patterns in order) finds the first root value where each
switches. Cutting the root there, every comparison of ``T(r)`` with the thresholds is
constant on every piece, and the table holds exactly.

:class:`Casts` is that chain, kept with a state's value ids (``State.casts``): the cast
calls in order and the root's dtype and bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dpnode.core.engine.dtypes import DType
from dpnode.core.engine.prims import REGISTRY, Call
from dpnode.core.engine.prims.elementwise import as_np
from dpnode.core.engine.subnormals import flushing
from dpnode.core.privacy.state import Array

__all__ = ["ROOTS", "Casts"]

#: root dtypes whose values the bisection can enumerate in order: float dtype -> the
#: unsigned integer of its bits and its sign bit; integers are their own order
ROOTS: dict[str, tuple[Any, int]] = {
    "float16": (np.uint16, 1 << 15),
    "float32": (np.uint32, 1 << 31),
    "float64": (np.uint64, 1 << 63),
    **{n: (None, 0) for n in ("int8", "int16", "int32", "int64", "uint8")},
}

_TOP = np.uint64(1 << 63)
#: root values tried at once per threshold in :meth:`Casts.cuts` (64-bit keys: 11 rounds)
_WAYS = 63


@dataclass(frozen=True)
class Casts:
    """Casts applied, in order, to a root's values (by ``calls``' kernels) and the root's
    dtype and bounds (the value ids' root: an input column and its moved copies)."""

    calls: tuple[Call, ...]
    root: str
    lo: float
    hi: float

    def then(self, call: Call) -> Casts:
        """This chain followed by the cast ``call``."""
        return Casts((*self.calls, call), self.root, self.lo, self.hi)

    def apply(self, values: Array) -> Array:
        """``values`` of the root's dtype through every cast, as the engine computes them."""
        with np.errstate(all="ignore"), flushing():
            return self._through(values)

    def _through(self, values: Array) -> Array:
        v = values
        for call in self.calls:
            v = np.asarray(REGISTRY["convert_element_type"].kernel(call, [v], None))
        return v

    def cuts(self, thresholds: Array, cd: DType, lo: float, hi: float) -> Array:
        """The root values in ``(lo, hi]`` (values of the root dtype) where the chain, then
        the conversion to the comparison dtype ``cd``, first reaches each threshold
        (``>=``) and first passes it (``>``), as float64; thresholds are values of ``cd``.

        A search over the root's values in order, :data:`_WAYS` of them at a time (the
        predicate is monotone, so the first value where it holds is bracketed by the
        last tried value where it does not and the first where it does).

        >>> from dpnode.core.engine.dtypes import dtype
        >>> c = Casts((), "float64", 0.0, 2.0)
        >>> c.cuts(np.array([1.0], dtype=np.float32), dtype("float32"), 0.0, 2.0).tolist()
        [0.9999999701976776, 1.000000059604645]
        """
        order, sign = ROOTS[self.root]
        rd = np.dtype(self.root)
        b = np.concatenate([thresholds, thresholds]).astype(cd.np)[:, None]
        strict = np.repeat([False, True], len(thresholds))[:, None]
        first, last = _key(np.asarray([lo, hi], dtype=rd), order, sign)
        low = np.full(len(b), first, dtype=np.uint64)  # the answer is in [low, high]
        high = np.full(len(b), last + np.uint64(1), dtype=np.uint64)  # last + 1: none
        ways = np.arange(1, _WAYS + 1, dtype=np.uint64)
        with np.errstate(all="ignore"), flushing():
            while bool(np.any(high > low)):
                step = np.maximum((high - low) // np.uint64(_WAYS + 1), np.uint64(1))
                open_ = high > low
                top = np.where(open_, high - np.uint64(1), low)
                points = np.minimum(low[:, None] + step[:, None] * ways, top[:, None])
                t = as_np(self._through(_value(points, rd, order, sign)), cd)
                reached = np.where(strict, t > b, t >= b) & open_[:, None]
                missed = ~reached & open_[:, None]
                high = np.minimum(high, np.where(reached, points, high[:, None]).min(axis=1))
                beyond = np.where(missed, points + np.uint64(1), low[:, None]).max(axis=1)
                low = np.where(open_, np.maximum(low, beyond), low)
        inside = (low > first) & (low <= last)  # a switch at the first value is no cut
        return _value(low[inside], rd, order, sign).astype(np.float64)


def _key(v: Array, order: Any, sign: int) -> Array:
    """Values in their order as uint64 keys (``-0.0`` and ``0.0`` share one)."""
    if order is None:  # an integer: offset so that the order of int64 is that of uint64
        return v.astype(np.int64).view(np.uint64) ^ _TOP
    bits = v.view(order).astype(np.uint64)
    s = np.uint64(sign)
    # a negative value's key counts down from the sign bit (modulo 2^64 for float64)
    keys = np.where(bits >= s, np.uint64(2 * sign % 2**64) - bits, bits + s)
    return np.asarray(keys, dtype=np.uint64)


def _value(k: Array, rd: np.dtype[Any], order: Any, sign: int) -> Array:
    """The values of dtype ``rd`` with keys ``k`` (the inverse of :func:`_key`)."""
    if order is None:
        return (k ^ _TOP).view(np.int64).astype(rd)
    s = np.uint64(sign)
    bits = np.where(k >= s, k - s, np.uint64(2 * sign % 2**64) - k)
    return bits.astype(order).view(rd)
