"""Helpers on broadcast views: compact forms, varying axes, per-subject segment sums.

State arrays are kept as small as their content allows (a column's bounds are one
element broadcast to ``n``). These helpers find the axes along which an array really
varies and give back its compact form, so rules can work on the small array.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from node.privacy.subjects import distinct_view, rows_of

__all__ = [
    "compact",
    "fit",
    "pad_left",
    "recompact",
    "reduce_array",
    "segment_max",
    "varying_axes",
]

Array = npt.NDArray[Any]


def pad_left(a: Array, ndim: int) -> Array:
    """``a`` with leading size-1 axes up to ``ndim`` dims.

    >>> pad_left(np.zeros((3,)), 3).shape
    (1, 1, 3)
    """
    a = np.asarray(a)
    return a.reshape((1,) * (ndim - a.ndim) + a.shape) if a.ndim < ndim else a


def varying_axes(a: Array, shape: Sequence[int], exact: bool = False) -> list[bool]:
    """For each axis of ``shape``, whether ``a`` broadcast to it may differ along that axis.

    Judged from the layout (a broadcast or size-1 axis cannot differ), which costs nothing;
    with ``exact`` an axis the layout calls varying is also checked by value, for the
    decisions that refuse a graph or pick a rule.

    >>> varying_axes(np.arange(3.0)[:, None], (3, 4))
    [True, False]
    >>> varying_axes(np.ones((3, 4)), (3, 4)), varying_axes(np.ones((3, 4)), (3, 4), exact=True)
    ([True, True], [False, False])
    """
    if exact:
        rows = rows_of(a, shape)
        if rows is not None:  # a subject column: varies along its axis unless one subject
            single = rows.subjects.max_rows == rows.subjects.rows
            return [d == rows.axis and not single for d in range(len(shape))]
    b = np.broadcast_to(a, tuple(shape))
    out = [n > 1 and st != 0 for n, st in zip(b.shape, b.strides, strict=True)]
    if exact and distinct_view(a):  # different elements of distinct ids differ
        return out
    if exact and any(out):
        f = fit(b, shape)  # only the real (non-broadcast) extent is compared
        for ax, v in enumerate(out):
            if v:
                first = np.take(f, [0], axis=ax)
                out[ax] = not bool(np.array_equal(f, np.broadcast_to(first, f.shape)))
    return out


def fit(a: npt.ArrayLike, shape: Sequence[int]) -> Array:
    """``a`` as an array of ``len(shape)`` dims, broadcastable to ``shape``, without copies.

    Broadcast axes become size 1, so arithmetic between fitted arrays stays small.

    >>> fit(np.broadcast_to(np.arange(3.0), (5, 3)), (5, 3)).shape
    (1, 3)
    >>> fit(2.0, (2, 3)).shape
    (1, 1)
    """
    if isinstance(a, np.ndarray) and a.ndim == len(shape):
        for m, n, st in zip(a.shape, shape, a.strides, strict=True):
            if (m != n and (m != 1 or n == 0)) or (m > 1 and st == 0):
                break
        else:  # already fitted (the common case): no broadcast view to build and slice
            return a
    elif np.ndim(a) == 0 and 0 not in shape:  # a scalar: one element in every axis
        one = np.asarray(a).reshape((1,) * len(shape))
        one.flags.writeable = False
        return one
    b = np.broadcast_to(np.asarray(a), tuple(shape))
    idx = tuple(
        slice(0, 1) if (n > 1 and st == 0) else slice(None)
        for n, st in zip(b.shape, b.strides, strict=True)
    )
    return b[idx]


compact = fit


def reduce_array(a: Array, shape: tuple[int, ...], dims: tuple[int, ...], fn: str = "sum") -> Array:
    """``fn`` ("sum", "max", "min") of ``a`` broadcast to ``shape`` over ``dims``, kept as 1s.

    Works on the compact form: a sum over a broadcast axis is a product by its size.

    >>> reduce_array(np.float64(2.0), (3, 4), (0,)).tolist()
    [[6.0]]
    """
    comp = compact(a, shape)
    if not dims:
        return comp
    if fn == "sum":
        mult = math.prod(shape[d] for d in dims if comp.shape[d] == 1 and shape[d] != 1)
        return np.asarray(comp.sum(axis=dims, keepdims=True) * mult)
    f = np.max if fn == "max" else np.min
    return np.asarray(f(comp, axis=dims, keepdims=True))


def recompact(a: Array) -> Array:
    """``a`` with every axis along which its values are all equal reduced to size 1.

    >>> recompact(np.array([[1, 2], [1, 2]])).shape
    (1, 2)
    """
    for ax in range(a.ndim):
        if a.shape[ax] > 1:
            first = np.take(a, [0], axis=ax)
            if np.array_equal(a, np.broadcast_to(first, a.shape)):
                a = first
    return a


def segment_max(values: Array, keys: Array, nkeys: int) -> Array:
    """Maximum of ``values`` per key (``-inf`` for keys that never occur).

    >>> segment_max(np.array([1.0, 5.0, 2.0]), np.array([0, 0, 2]), 3)
    array([  5., -inf,   2.])
    """
    out = np.full(nkeys, -np.inf)
    np.maximum.at(out, keys, values)
    return out
