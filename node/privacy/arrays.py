"""Helpers on broadcast views: compact forms, varying axes, per-subject segment sums.

State arrays are kept as small as their content allows (a column's bounds are one
element broadcast to ``n``). These helpers find the axes along which an array really
varies and give back its compact form, so rules can work on the small array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["compact", "pad_left", "segment_max", "varying_axes"]

Array = npt.NDArray[Any]


def pad_left(a: Array, ndim: int) -> Array:
    """``a`` with leading size-1 axes up to ``ndim`` dims.

    >>> pad_left(np.zeros((3,)), 3).shape
    (1, 1, 3)
    """
    a = np.asarray(a)
    return a.reshape((1,) * (ndim - a.ndim) + a.shape) if a.ndim < ndim else a


def varying_axes(a: Array, shape: Sequence[int]) -> list[bool]:
    """For each axis of ``shape``, whether ``a`` broadcast to it differs along that axis.

    >>> varying_axes(np.arange(3.0)[:, None], (3, 4))
    [True, False]
    >>> varying_axes(np.zeros((3, 4)), (3, 4))
    [False, False]
    """
    b = np.broadcast_to(a, tuple(shape))
    out = []
    for ax, (n, st) in enumerate(zip(b.shape, b.strides, strict=True)):
        if n <= 1 or st == 0:
            out.append(False)
        else:
            first = np.take(b, [0], axis=ax)
            out.append(not bool(np.array_equal(b, np.broadcast_to(first, b.shape))))
    return out


def compact(a: Array, shape: Sequence[int]) -> Array:
    """``a`` broadcast to ``shape``, with every non-varying axis reduced to size 1.

    >>> compact(np.broadcast_to(np.arange(3.0), (5, 3)), (5, 3)).shape
    (1, 3)
    """
    b = np.broadcast_to(a, tuple(shape))
    idx = tuple(slice(None) if v else slice(0, 1) for v in varying_axes(b, shape))
    return np.ascontiguousarray(b[idx]) if b.ndim else np.asarray(b)


def segment_max(values: Array, keys: Array, nkeys: int) -> Array:
    """Maximum of ``values`` per key (``-inf`` for keys that never occur).

    >>> segment_max(np.array([1.0, 5.0, 2.0]), np.array([0, 0, 2]), 3)
    array([  5., -inf,   2.])
    """
    out = np.full(nkeys, -np.inf)
    np.maximum.at(out, keys, values)
    return out
