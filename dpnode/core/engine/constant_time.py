"""Choosing between values in time that does not depend on which are chosen.

``np.where(cond, a, b)`` branches on each element: on the dev box it takes 0.9 ms for 2
million float64 values when ``cond`` is all true or all false and 7.2 ms when it is a random
half, and ``np.copyto(dst, src, where=cond)`` takes 0.1 ms when ``cond`` is all false. On a
private condition (``where(x > t, ...)``, the rows whose gradient norm exceeds the clipping
bound) the time of an answered publish then shows how many rows the condition holds for.

:func:`select` blends the bits instead, ``b ^ ((a ^ b) & mask)`` with a mask of all ones
where ``cond`` holds: four passes of integer arithmetic over every element, whatever the
values (about 2.5 ms for the same 2 million), and the exact bits of ``a`` or ``b`` (NaN
payloads, signed zeros), as ``np.where`` gives. The engine's ``where`` prim and the DP-SGD
clip use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["by_blocks", "into", "select"]

#: the unsigned integer dtype of each item size, whose bits an array is blended as
_BITS: dict[int, np.dtype[Any]] = {
    n: np.dtype(t) for n, t in ((1, np.uint8), (2, np.uint16), (4, np.uint32), (8, np.uint64))
}
#: elements blended at once (a mask of 512 KiB in float64)
_CHUNK = 1 << 16
#: elements a kernel of many passes computes at once (:func:`by_blocks`: 512 KiB in float64;
#: smaller blocks pay more in calls than they save in cache: sin of 2M values took 57 ms by
#: blocks of 2^14, 49 by 2^16, 52 by 2^15)
_BLOCK = 1 << 16


def select(
    cond: Any, a: Any, b: Any, dtype: Any = None, *, out: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any]:
    """``np.where(cond, a, b)`` (cast to ``dtype``, by default their result type), in time
    that depends on the shapes and dtype only.

    ``out``: where to write the result (it may be ``a`` or ``b``: each element is read
    before it is written).

    >>> select(np.array([True, False, True]), np.array([1.0, 2.0, -0.0]), 9.0).tolist()
    [1.0, 9.0, -0.0]
    """
    cond = np.asarray(cond, dtype=np.bool_)
    d = np.dtype(dtype) if dtype is not None else np.result_type(a, b)
    bits = _BITS.get(d.itemsize)
    if bits is None:  # no integer of this width (complex128): as NumPy does
        return np.asarray(np.where(cond, a, b), dtype=d)
    a = np.asarray(a, dtype=d)
    b = np.asarray(b, dtype=d)
    shape = np.broadcast_shapes(cond.shape, a.shape, b.shape)
    if out is None:
        out = np.empty(shape, dtype=d)
    elif out.shape != shape or out.dtype != d:
        raise ValueError(f"out is {out.dtype}{list(out.shape)}, the result {d}{list(shape)}")
    ones = np.full((), -1, dtype=np.int64).astype(bits)  # every bit set
    conds = np.broadcast_to(cond, shape)
    ua = np.broadcast_to(a, shape).view(bits)
    ub = np.broadcast_to(b, shape).view(bits)
    result = out.view(bits)
    aliased = np.may_share_memory(out, b)  # the first pass would write over b
    if not shape:
        _blend(conds, ua, ub, result, ones, np.empty((), bits), aliased)
        return out
    # by blocks of leading rows, so that the mask stays in the cache (and is allocated once)
    step = max(1, _CHUNK // max(1, math.prod(shape[1:])))
    mask = np.empty((min(step, shape[0]), *shape[1:]), dtype=bits)
    for start in range(0, shape[0], step):
        rows = slice(start, start + step)
        part = result[rows]
        _blend(conds[rows], ua[rows], ub[rows], part, ones, mask[: part.shape[0]], aliased)
    return out


def _blend(cond: Any, ua: Any, ub: Any, result: Any, ones: Any, mask: Any, aliased: bool) -> None:
    """``result = ub ^ ((ua ^ ub) & mask)``, ``mask`` all ones where ``cond``: four passes of
    integer arithmetic, the same whatever the values."""
    np.multiply(cond, ones, out=mask, dtype=mask.dtype)
    if aliased:
        ub = ub.copy()
    np.bitwise_xor(ua, ub, out=result)
    np.bitwise_and(result, mask, out=result)
    np.bitwise_xor(result, ub, out=result)


def by_blocks(fn: Callable[..., np.ndarray[Any, Any]], *arrays: Any) -> np.ndarray[Any, Any]:
    """``fn`` of same-shaped float64 arrays, elementwise, computed by blocks that stay in the
    cache: a kernel of twenty passes over its temporaries runs 2 to 3 times as fast."""
    shape = np.shape(arrays[0])
    flats = [np.ascontiguousarray(a, dtype=np.float64).reshape(-1) for a in arrays]
    r = np.empty(flats[0].size, dtype=np.float64)
    for start in range(0, r.size, _BLOCK):
        r[start : start + _BLOCK] = fn(*(f[start : start + _BLOCK] for f in flats))
    return r.reshape(shape)


def into(r: Any, out: np.ndarray[Any, Any] | None, dtype: Any = None) -> np.ndarray[Any, Any]:
    """A kernel's result ``r`` (cast to ``dtype``, if given), written into ``out`` if the
    caller passed one, as a ufunc's ``out=`` does."""
    r = np.asarray(r, dtype=dtype)
    if out is None:
        return r  # type: ignore[no-any-return]
    np.copyto(out, r)
    return out
